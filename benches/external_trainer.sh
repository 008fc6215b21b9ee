#!/usr/bin/env bash
# One step's update batch through sesa's trainer and through the PyTorch reference trainer
# (examples/external_trainer/grpo_trainer.py), side by side: the same loss, entropy, KL and clip
# fraction within the tolerance printed at the end.
#
#   benches/external_trainer.sh MODEL_DIR
#
# MODEL_DIR is a Hugging Face directory, e.g. a warm start exported from a learning run, or the
# published model as loaded:
#   sesa model export runs/<learn-run> --version 1 --out warm
#   sesa model export smollm2-135m-instruct --out smollm2
# The reference trainer runs on the GPU when PyTorch sees one (scripts/gpu-check uses this).
# One step of specs/learn.yaml (no warm start, no evaluation) runs with `sesa train-external`
# as its external trainer, which writes the batch; the reference trainer then trains the same
# batch from the same weights. Two epochs of two mini-batches, so the second epoch's ratios and
# KL are away from 1 and 0. Installs torch, transformers and pyarrow from PyPI on first use.
#
# PROCS=N also trains the batch data-parallel under `torchrun --nproc_per_node N` (gloo on the
# CPU, NCCL on GPUs) and checks it against the one process: every metric within 1e-4 relative,
# and the weights' difference (L2 over all of them) within 1 % of the change the step made (L2).
# Partial gradients summed across processes round otherwise than one sum, and AdamW's first step
# moves a weight by about lr whatever its gradient's size (m / sqrt(v)), so a weight whose
# gradient is near 0 can move differently: the largest single difference is printed too.
set -euo pipefail
python3 -c 'import torch, transformers, pyarrow' 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check torch transformers pyarrow
model=$(realpath "${1:?usage: benches/external_trainer.sh MODEL_DIR}")
cd "$(dirname "$0")/.."
sesa=${SESA:-target/release/sesa}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$sesa" run specs/learn.yaml --store "$work/runs" --set steps=1 --set seed=7 \
  --set stages.warmup=null --set stages.warm_start_eval=null --set stages.eval=null \
  --set 'stages.propose.after=[]' --set "model.model=$model" \
  --set stages.update.ppo_epochs=2 --set stages.update.mini_batch=16 --set stages.update.proposer_baseline_per_hops=false \
  --set "stages.update.external={command: [$sesa, train-external, --model, $model], dir: $work/external}" \
  > "$work/run.log" 2>&1 || { tail -30 "$work/run.log"; exit 1; }
step="$work/external/step-00000001"
echo "batch: $(python3 -c "import pyarrow.parquet as pq; t = pq.read_table('$step/batch.parquet'); print(t.num_rows, 'trajectories')")"

python3 examples/external_trainer/grpo_trainer.py --model "$model" \
  --result "$work/torch.json" --checkpoint-dir "$work/torch-checkpoint" "$step/manifest.json" | grep '^trained on'

python3 - "$step/result.json" "$work/torch.json" <<'EOF'
import json, sys
sesa, torch = (json.load(open(p))["metrics"] for p in sys.argv[1:3])
TOLERANCE = 2e-3  # relative, or absolute below 1e-3
worst = 0.0
print(f"{'role':<9} {'metric':<14} {'sesa':>12} {'pytorch':>12} {'difference':>11}")
for role in sesa:
    for metric in ("optimizer_steps", "loss", "pg_loss", "kl", "clip_fraction", "entropy", "grad_norm"):
        a, b = sesa[role].get(metric, 0.0), torch[role].get(metric, 0.0)
        difference = abs(a - b) / max(abs(a), abs(b), 1e-3)
        worst = max(worst, difference)
        print(f"{role:<9} {metric:<14} {a:>12.6g} {b:>12.6g} {abs(a - b):>11.2e}")
print(f"largest relative difference: {worst:.2e}; tolerance {TOLERANCE}")
sys.exit(0 if worst <= TOLERANCE else 1)
EOF

if [ -n "${PROCS:-}" ]; then
  python3 -m torch.distributed.run --standalone --nproc_per_node "$PROCS" examples/external_trainer/grpo_trainer.py \
    --model "$model" --result "$work/ddp.json" --checkpoint-dir "$work/ddp-checkpoint" "$step/manifest.json" |
    grep '^trained on'
  python3 - "$work/torch.json" "$work/ddp.json" "$work/torch-checkpoint" "$work/ddp-checkpoint" "$PROCS" "$model" <<'EOF'
import json, sys
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
one, many = (json.load(open(p))["metrics"] for p in sys.argv[1:3])
worst = 0.0
print(f"{'role':<9} {'metric':<14} {'1 process':>12} {sys.argv[5] + ' processes':>12} {'difference':>11}")
for role in one:
    for metric in ("optimizer_steps", "loss", "pg_loss", "kl", "clip_fraction", "entropy", "grad_norm", "logprob_gap"):
        a, b = one[role].get(metric, 0.0), many[role].get(metric, 0.0)
        worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-3))
        print(f"{role:<9} {metric:<14} {a:>12.6g} {b:>12.6g} {abs(a - b):>11.2e}")
a, b = (load_file(f"{d}/model.safetensors") for d in sys.argv[3:5])
start = AutoModelForCausalLM.from_pretrained(sys.argv[6]).state_dict()
largest = max((a[k] - b[k]).abs().max().item() for k in a)
apart = sum((a[k] - b[k]).double().pow(2).sum().item() for k in a) ** 0.5
moved = sum((a[k] - start[k]).double().pow(2).sum().item() for k in a) ** 0.5
print(f"data-parallel: largest relative metric difference {worst:.2e} (tolerance 1e-4); weights apart by "
      f"{apart / moved:.2e} of the step's change (L2, tolerance 1 %), largest single difference {largest:.2e}")
sys.exit(0 if worst <= 1e-4 and apart <= 0.01 * moved else 1)
EOF
fi
