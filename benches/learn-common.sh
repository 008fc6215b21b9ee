# Shared by benches/learn.sh and benches/depth.sh (sourced, after each sets LIMIT, VAL,
# EVAL_LIMIT and STORE): the tools, the warm start of specs/learn.yaml with a held-out tail,
# its export, and the overrides that start self-play from that export.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sesa/target}"
python3 -m pip install --quiet --disable-pip-version-check duckdb matplotlib
cargo build --locked --features mistralrs --bin sesa
sesa="$CARGO_TARGET_DIR/debug/sesa"
mkdir -p "$STORE"
started=$(date +%s)
clock() { echo "[$(( $(date +%s) - started )) s] $*"; }
run_id() { grep -o "→ .*" "$1" | head -1 | cut -c5-; }

# warm_start ARGS…: specs/learn.yaml's warmup on the training world's first LIMIT questions,
# its last VAL held out and evaluated (`train_val`) beside EVAL_LIMIT questions of the unseen
# world; sets warm_run and exports its policy to $STORE/warm.
warm_start() {
  "$sesa" run specs/learn.yaml --store "$STORE" --set steps=1 --set model.dtype=int8 "$@" \
    --set stages.warmup.world.limit="$LIMIT" --set stages.warmup.world.held_out="$VAL" \
    --set stages.warm_start_eval.benchmarks.unseen_world.limit="$EVAL_LIMIT" \
    --set stages.warm_start_eval.benchmarks.train_val="{questions: data/world-train/questions.jsonl, last: $VAL}" \
    --set stages.propose=null --set stages.verify=null --set stages.solve=null \
    --set stages.reward=null --set stages.update=null --set stages.eval=null >"$STORE/warm.log" 2>&1 \
    || { tail -20 "$STORE/warm.log"; exit 1; }
  warm_run=$(run_id "$STORE/warm.log")
  python3 benches/learn_report.py "$warm_run" --benchmark train_val
  clock "export"
  "$sesa" model export "$warm_run" --version 1 --out "$STORE/warm"
}

# Self-play from $STORE/warm: no warm start of its own, EVAL_LIMIT questions of the unseen world
# in its evaluations, and invalid proposals replaced (while the reuse pool is empty) by the
# training world's questions of at most two hops, less its held-out tail.
total=$(wc -l <data/world-train/questions.jsonl)
head -n "$(( total - VAL ))" data/world-train/questions.jsonl >"$STORE/substitutes.jsonl"
from_warm_start=(--set model.model="$STORE/warm" --set model.dtype=int8
  --set stages.warmup=null --set stages.warm_start_eval=null --set 'stages.propose.after=[]'
  --set stages.eval.benchmarks.unseen_world.limit="$EVAL_LIMIT"
  --set stages.verify.fallback_questions="$STORE/substitutes.jsonl" --set stages.verify.fallback_max_hops=2)
