#!/usr/bin/env bash
# Training speed: sesa's trainer beside PyTorch on the same computation (SmolLM2-135M, one
# sequence of T tokens, loss on every position, AdamW), full fine-tuning and LoRA r = 16 (on
# every block, then on the top 8); then sesa alone on a GRPO group whose prompt is shared.
#   SESA=target/release/sesa benches/train.sh [T]
# Installs torch, transformers, peft and gguf from PyPI on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
SESA=${SESA:-target/release/sesa}
T=${1:-512}
python3 -m pip install --quiet --disable-pip-version-check torch transformers peft gguf
model_dir=$("$SESA" model fetch smollm2-135m-instruct)
gguf=$(cd "$model_dir" && ls *.gguf | head -1)
for method in full lora; do
  echo "== sesa, $method, T=$T"
  "$SESA" bench-train --model smollm2-135m-instruct --tokens "$T" --method "$method" --steps 3
  echo "== sesa, $method, T=$T, logits only where the loss mask is on (the last 25% of positions)"
  "$SESA" bench-train --model smollm2-135m-instruct --tokens "$T" --method "$method" --steps 3 --scored 0.25
  echo "== PyTorch, $method, T=$T"
  python3 benches/train_torch.py "$model_dir" --gguf "$gguf" --tokens "$T" --method "$method" --steps 3
done
# LoRA on the top 8 of the 30 blocks: the backward pass stops below them, in both.
echo "== sesa, lora on the top 8 blocks, T=$T"
"$SESA" bench-train --model smollm2-135m-instruct --tokens "$T" --method lora --top-layers 8 --steps 3
echo "== PyTorch, lora on the top 8 blocks, T=$T"
python3 benches/train_torch.py "$model_dir" --gguf "$gguf" --tokens "$T" --method lora --top-layers 8 --steps 3
# A GRPO group as the learning recipe trains it: 8 rollouts of 480 tokens whose first 120 (the
# prompt) are the same, trained with the prompt run once and apart, alternated (sesa alone).
for method in full lora; do
  echo "== sesa, $method, a group of 8 × 480 tokens sharing a 120-token prompt"
  "$SESA" bench-train --model smollm2-135m-instruct --tokens 480 --group 8 --prompt 120 --method "$method" --steps 3
done
