#!/usr/bin/env bash
# Rollout throughput, side by side on this machine:
#   1. sesa's agent loop: N concurrent solver trajectories with real BM25 search
#      (`sesa bench-rollouts`, the spec's policy backend);
#   2. the same tokens without the loop: every turn's recorded context and generation replayed
#      as plain requests (no search, no parsing) on a fresh copy of the policy;
#   3. raw generation of exactly the same number of generated tokens from the same prompts (no
#      tool results), same backend;
#   all three with F32 weights, then with int8 weights (`--set model.dtype=int8`);
#   4. llama.cpp on the same GGUF re-quantised to each of its types that run this model fast here
#      (Q4_1 as published, Q8_0, F16, F32): `llama-batched-bench` with N parallel sequences.
#
# Usage: [SESA=path/to/sesa] benches/rollouts.sh [SPEC] [QUESTIONS] [N]
#   defaults: specs/smollm2_agent.yaml, data/world/questions.jsonl (the world and its index are
#   generated first if missing), 32
#
# llama.cpp: Debian 12 has no package, so the script builds it once from the llama-cpp-python
# sdist on PyPI (its vendor/llama.cpp, ggml-org/llama.cpp@0c1e57098 for 0.3.36) into
# $SESA_HOME/llama.cpp, with cmake from PyPI when the system has none (about 6 minutes on
# 2 cores). CPU backend, -march=native, the defaults otherwise. The other types are written by its
# `llama-quantize --allow-requantize` from the published Q4_1 (so every type holds the same
# values as the file sesa dequantizes).
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
echo "== sesa: agent loop and raw generation ($N trajectories), F32 weights"
"${SESA[@]}" bench-rollouts --spec "$SPEC" --questions "$QUESTIONS" --trajectories "$N" | tee /tmp/sesa-bench-rollouts.txt
echo "== sesa: the same with int8 weights (--set model.dtype=int8)"
"${SESA[@]}" bench-rollouts --spec "$SPEC" --questions "$QUESTIONS" --trajectories "$N" --set model.dtype=int8

LLAMA=$SESA_HOME/llama.cpp
if [ ! -x "$LLAMA/build/bin/llama-batched-bench" ] || [ ! -x "$LLAMA/build/bin/llama-quantize" ]; then
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
  "$CMAKE" --build "$LLAMA/build" -j"$(nproc)" --target llama-batched-bench llama-quantize >/dev/null
fi

# The loop's mean prompt and generated tokens per trajectory, for a like-for-like llama.cpp run.
PROMPT_TOKENS=$(awk '/^mean prompt/ {print $3}' /tmp/sesa-bench-rollouts.txt)
GEN_TOKENS=$(awk '/^mean generated/ {print $3}' /tmp/sesa-bench-rollouts.txt)
GGUF=$SESA_HOME/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
for TYPE in Q4_1 Q8_0 F16 F32; do
  FILE=$GGUF
  if [ "$TYPE" != Q4_1 ]; then
    FILE=$LLAMA/SmolLM2-135M-Instruct.$TYPE.gguf
    [ -f "$FILE" ] || "$LLAMA/build/bin/llama-quantize" --allow-requantize "$GGUF" "$FILE" "$TYPE" >/dev/null 2>&1
  fi
  echo "== llama.cpp $TYPE: $N sequences x ($PROMPT_TOKENS prompt + $GEN_TOKENS generated tokens), $(nproc) threads"
  "$LLAMA/build/bin/llama-batched-bench" -m "$FILE" -t "$(nproc)" -c $((N * (PROMPT_TOKENS + GEN_TOKENS) + 256)) \
    -b 2048 -ub 512 -npp "$PROMPT_TOKENS" -ntg "$GEN_TOKENS" -npl "$N" 2>/dev/null | tail -n 4
done
echo "(S_PP and S_TG are llama.cpp's prompt and generation throughput in tokens/s: compare them with"
echo " sesa's 'prompts + first tokens' and 'decoding' lines above; the fastest type is llama.cpp's best.)"
