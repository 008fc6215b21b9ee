#!/usr/bin/env bash
# Rollout throughput, side by side on this machine:
#   1. sesa's agent loop: N concurrent solver trajectories with real BM25 search
#      (`sesa bench-rollouts`, the spec's policy backend);
#   2. the same tokens without the loop: every turn's recorded context and generation replayed
#      as plain requests (no search, no parsing) on a fresh copy of the policy;
#   3. raw generation of exactly the same number of generated tokens from the same prompts (no
#      tool results), same backend;
#   4. llama.cpp on the same GGUF: `llama-batched-bench` with N parallel sequences.
#
# Usage: [SESA=path/to/sesa] benches/rollouts.sh [SPEC] [QUESTIONS] [N]
#   defaults: specs/smollm2_agent.yaml, data/world/questions.jsonl (the world and its index are
#   generated first if missing), 32
#
# llama.cpp: Debian 12 has no package, so the script builds it once from the llama-cpp-python
# sdist on PyPI (its vendor/llama.cpp, ggml-org/llama.cpp@0c1e57098 for 0.3.36) into
# $SESA_HOME/llama.cpp, with cmake from PyPI when the system has none (about 6 minutes on
# 2 cores). CPU backend, -march=native, the defaults otherwise (the fastest llama.cpp configuration measured on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${1:-specs/smollm2_agent.yaml}
QUESTIONS=${2:-data/world/questions.jsonl}
N=${3:-32}
SESA_HOME=${SESA_HOME:-$HOME/.cache/sesa}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sesa/target}
# The sesa command: a release build by default; SESA=path/to/sesa uses a binary already built.
read -r -a SESA <<<"${SESA:-cargo run --release --quiet --}"

if [ ! -d data/world-index ]; then
  "${SESA[@]}" world generate --seed 1 --out data/world
  "${SESA[@]}" index build data/world/corpus.jsonl --out data/world-index
fi
echo "== sesa: agent loop and raw generation ($N trajectories)"
"${SESA[@]}" bench-rollouts --spec "$SPEC" --questions "$QUESTIONS" --trajectories "$N" | tee /tmp/sesa-bench-rollouts.txt

LLAMA=$SESA_HOME/llama.cpp
if [ ! -x "$LLAMA/build/bin/llama-batched-bench" ]; then
  echo "== building llama.cpp from the llama-cpp-python sdist into $LLAMA"
  work=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$work"
  tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
  mkdir -p "$LLAMA"
  cp -r "$work"/llama_cpp_python-0.3.36/vendor/llama.cpp/. "$LLAMA"
  CMAKE=$(command -v cmake || true)
  if [ -z "$CMAKE" ]; then
    python3 -m venv "$work/cmake-venv"
    "$work/cmake-venv/bin/pip" install --quiet cmake
    CMAKE=$work/cmake-venv/bin/cmake
  fi
  "$CMAKE" -S "$LLAMA" -B "$LLAMA/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_COMMIT=0c1e57098 >/dev/null
  "$CMAKE" --build "$LLAMA/build" -j"$(nproc)" --target llama-batched-bench >/dev/null
fi

# The loop's mean prompt and generated tokens per trajectory, for a like-for-like llama.cpp run.
PROMPT_TOKENS=$(awk '/^mean prompt/ {print $3}' /tmp/sesa-bench-rollouts.txt)
GEN_TOKENS=$(awk '/^mean generated/ {print $3}' /tmp/sesa-bench-rollouts.txt)
GGUF=$SESA_HOME/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== llama.cpp: $N sequences x ($PROMPT_TOKENS prompt + $GEN_TOKENS generated tokens), 2 threads"
"$LLAMA/build/bin/llama-batched-bench" -m "$GGUF" -t "$(nproc)" -c $((N * (PROMPT_TOKENS + GEN_TOKENS) + 256)) \
  -b 2048 -ub 512 -npp "$PROMPT_TOKENS" -ntg "$GEN_TOKENS" -npl "$N" 2>/dev/null | tail -n 4
echo "(S_TG is llama.cpp's aggregate generation throughput in tokens/s; compare with sesa's lines above.)"
