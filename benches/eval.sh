#!/usr/bin/env bash
# Evaluation throughput: greedy solver episodes per minute with `sesa eval` on the HotpotQA
# pack (BM25 over its own passages, top 3), SmolLM2-135M on the candle backend with the
# budgets of specs/learn.yaml (up to four searches and an answer, 40 tokens a turn).
#
#   benches/eval.sh DATA_DIR [MODEL]
#
# DATA_DIR holds hotpotqa/questions.jsonl and hotpotqa/corpus.jsonl (FlashRAG format). MODEL is
# a model name or a Hugging Face directory, e.g. a warm start exported with `sesa model export`
# (default: smollm2-135m-instruct as published). N questions (default 200), a seeded sample.
set -euo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: benches/eval.sh DATA_DIR [MODEL]}"
model="${2:-smollm2-135m-instruct}"
n="${N:-200}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sesa/target}"
cargo build --locked --features mistralrs --bin sesa
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
"$CARGO_TARGET_DIR/debug/sesa" eval specs/learn.yaml --mode base --store "$store" \
  --set model.model="$model" --sample "$n" --sample-seed 1 \
  --set stages.evaluate.benchmarks.hotpotqa.index="$store/hotpotqa-index" \
  --benchmark hotpotqa="$data/hotpotqa/questions.jsonl,$data/hotpotqa/corpus.jsonl" 2>/dev/null
run=$(ls -d "$store"/learn-*/)
wall_ms=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_ms'])" "$run/commits/step-00000001.json")
python3 - "$n" "$wall_ms" <<'PY'
import sys
n, ms = int(sys.argv[1]), int(sys.argv[2])
print(f"evaluation: {n} HotpotQA questions in {ms / 1000:.1f} s (the evaluate stage, model loaded) = {n / (ms / 60000):.1f} questions/min")
PY
