#!/usr/bin/env bash
# Rollout throughput, side by side on this machine:
#   1. sesa's agent loop: N concurrent solver trajectories with real BM25 search
#      (`sesa bench-rollouts`, the spec's policy backend);
#   2. the same tokens without the loop: every turn's recorded context and generation replayed
#      as plain requests (no search, no parsing) on a fresh copy of the policy;
#   3. raw generation of exactly the same number of generated tokens from the same prompts (no
#      tool results), same backend;
#   all three with F32 weights, then with int8 weights (`--set model.dtype=int8`), then int8
#   weights with an F16 KV cache (`--set model.kv_cache_dtype=f16`, as llama.cpp caches);
#   4. llama.cpp on the same GGUF re-quantised to each of its types that run this model fast here
#      (Q4_1 as published, Q8_0, F16, F32): `llama-batched-bench` with N parallel sequences.
#
# Usage: [SESA=path/to/sesa] [ROUNDS=2] [KERNELS=portable] benches/rollouts.sh [SPEC] [QUESTIONS] [N]
#   defaults: specs/smollm2_agent.yaml, data/world/questions.jsonl (the world and its index are
#   generated first if missing), 32
#   ROUNDS: rounds of every configuration, one after another in each round; the speed of a
#     shared machine drifts from minute to minute, so ratios are taken within a round.
#   KERNELS: more int8 runs of sesa with its kernels held to a lower instruction set
#     (SESA_KERNELS=portable or avx2; by default AVX-512 or AVX2, the most the CPU has).
#   Ends with a table of prompt and decoding throughput per round, and sesa's over llama.cpp's
#   fastest type in the same round.
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
ROUNDS=${ROUNDS:-2}
read -r -a KERNELS <<<"${KERNELS:-}"
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

GGUF=$SESA_HOME/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
results=$(mktemp)
trap 'rm -f "$results"' EXIT
# sesa CONFIG [SESA_KERNELS] [--set ...]: one bench-rollouts run; its raw-generation line is the
# like-for-like figure (prompts + first tokens, then decoding).
sesa() {
  local config=$1 kernels=$2 out
  shift 2
  echo "== round $round: sesa $config ($N trajectories)"
  out=$(SESA_KERNELS=$kernels "${SESA[@]}" bench-rollouts --spec "$SPEC" --questions "$QUESTIONS" --trajectories "$N" \
    --repeats 1 "$@")
  echo "$out"
  PROMPT_TOKENS=$(awk '/^mean prompt/ {print $3}' <<<"$out")
  GEN_TOKENS=$(awk '/^mean generated/ {print $3}' <<<"$out")
  sed -nE "s/^raw generation.*prompt tokens, ([0-9.]+) tokens\/s\), decoding [0-9.]+ s \(([0-9.]+) tokens\/s\).*/$round\tsesa $config\t\1\t\2/p" \
    <<<"$out" >>"$results"
}
# llama TYPE: llama-batched-bench on the same shape as the sesa run before it.
llama() {
  local out file=$LLAMA/SmolLM2-135M-Instruct.$1.gguf
  if [ "$1" = Q4_1 ]; then
    file=$GGUF
  elif [ ! -f "$file" ]; then
    "$LLAMA/build/bin/llama-quantize" --allow-requantize "$GGUF" "$file" "$1" >/dev/null 2>&1
  fi
  echo "== round $round: llama.cpp $1: $N sequences x ($PROMPT_TOKENS prompt + $GEN_TOKENS generated tokens), $(nproc) threads"
  out=$("$LLAMA/build/bin/llama-batched-bench" -m "$file" -t "$(nproc)" -c $((N * (PROMPT_TOKENS + GEN_TOKENS) + 256)) \
    -b 2048 -ub 512 -npp "$PROMPT_TOKENS" -ntg "$GEN_TOKENS" -npl "$N" 2>/dev/null | grep '^|')
  echo "$out"
  awk -F'|' -v round="$round" -v config="llama.cpp $1" '$2 ~ /[0-9]/ { gsub(/ /, "")
    print round "\t" config "\t" $7 "\t" $9 }' <<<"$out" >>"$results"
}
for round in $(seq 1 "$ROUNDS"); do
  sesa F32 "" --set model.dtype=f32
  sesa int8 "" --set model.dtype=int8
  sesa "int8, F16 KV cache" "" --set model.dtype=int8 --set model.kv_cache_dtype=f16
  for kernels in "${KERNELS[@]}"; do sesa "int8 ($kernels)" "$kernels" --set model.dtype=int8; done
  for TYPE in Q4_1 Q8_0 F16 F32; do llama "$TYPE"; done
done

echo
echo "tokens/s (sesa: raw generation; llama.cpp: S_PP and S_TG); ratios: sesa int8 (either KV cache) over llama.cpp's fastest type of the round"
awk -F'\t' '{ rows[NR] = $0; if ($2 ~ /^llama/) { if ($3 > pp[$1]) pp[$1] = $3; if ($4 > tg[$1]) tg[$1] = $4 } }
  END {
    printf "| round | configuration | prompt | decode | prompt / llama.cpp best | decode / llama.cpp best |\n|---|---|---:|---:|---:|---:|\n"
    for (i = 1; i <= NR; i++) { split(rows[i], f, "\t"); ratio = f[2] ~ /^sesa int8/
      printf "| %s | %s | %.0f | %.0f | %s | %s |\n", f[1], f[2], f[3], f[4], ratio ? sprintf("%.2fx", f[3] / pp[f[1]]) : "", ratio ? sprintf("%.2fx", f[4] / tg[f[1]]) : "" }
  }' "$results"
