#!/usr/bin/env bash
# Self-play as the curriculum (docs/learning.md, "Depth from self-play"): can self-play teach
# the solver depth that no demonstration showed it?
#
#   benches/depth.sh                                  # about 1.5 h on 2 cores
#   LIMIT=8 VAL=10 EVAL_LIMIT=10 STEPS=1 benches/depth.sh   # a smoke run of the recipe
#
# 1. Warm start: specs/learn.yaml's `warmup` on the training world's first LIMIT questions
#    (default 200): solver demonstrations of one and two hops, proposer demonstrations of every
#    depth that passes SSP's rules; the last VAL questions (default 200) held out and evaluated
#    (`train_val`) beside the unseen world (`unseen_world`, EVAL_LIMIT questions, default 300).
# 2. Its export: both arms start from it, and it is the frozen policy they are compared with.
# 3. Self-play for STEPS steps (default 6), proposer and solver both trained (LoRA on the top 8
#    blocks, specs/learn.yaml's `update_method`; the arms of docs/learning.md before
#    2026-12-07 adapted every block: add --set trainer.update_method=null), SSP's rules, the
#    proposer asked for two to four hops and held to them (a search per hop, written where it
#    stops early, baselines per hop count), invalid proposals replaced from the reuse pool and,
#    while it is empty (and three a step whatever it holds), by training-world questions of one
#    to four hops (the solver must meet depth somewhere: this proposer's deep questions rarely
#    pass the RAG check); two arms
#    that differ only in `stages.solve.guidance` (GUIDANCE, default "none hint"), side by
#    side. Each is evaluated greedily at its last step.
# 4. benches/learn_report.py: per-hop success of each arm against the frozen warm start and
#    against each other (paired bootstrap), and the curves of self-play per hop count
#    ($STORE/depth-curves.png) and of held-out success ($STORE/depth-eval.png).
#
# Writes runs under $STORE (default runs-depth) and pictures to $STORE/depth-*.png.
# WARM_RUN=runs-depth/<id> skips steps 1 and 2 (the export must be in $STORE/warm).
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT="${LIMIT:-200}"
VAL="${VAL:-200}"
EVAL_LIMIT="${EVAL_LIMIT:-300}"
STEPS="${STEPS:-6}"
STORE="${STORE:-runs-depth}"
GUIDANCE="${GUIDANCE:-none hint}"
WARM_RUN="${WARM_RUN:-}"
source benches/learn-common.sh

if [ -n "$WARM_RUN" ]; then
  warm_run="$WARM_RUN"
else
  clock "warm start: the first $LIMIT questions' demonstrations"
  warm_start
fi
substitutes

pids=()
for guidance in $GUIDANCE; do
  clock "self-play: $STEPS steps, guidance $guidance"
  "$sesa" run specs/learn.yaml --store "$STORE" --set steps="$STEPS" "${from_warm_start[@]}" \
    --set stages.verify.fallback_max_hops=4 --set stages.eval.schedule=at_end \
    --set stages.solve.guidance="$guidance" >"$STORE/selfplay-$guidance.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || { for g in $GUIDANCE; do tail -5 "$STORE/selfplay-$g.log"; done; exit 1; }
done

clock "report"
runs=()
for guidance in $GUIDANCE; do runs+=("$(run_id "$STORE/selfplay-$guidance.log")"); done
labels=$(echo $GUIDANCE | sed 's/\([a-z]*\)/guidance \1/g; s/ guidance/,guidance/g')
python3 benches/learn_report.py "${runs[@]}" --frozen-run "$warm_run" --labels "$labels" \
  --depth-plot "$STORE/depth-curves.png" --compare-plot "$STORE/depth-eval.png"
clock "done: $warm_run ${runs[*]}"
