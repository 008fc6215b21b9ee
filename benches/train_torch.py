"""The computation of `sesa bench-train` in PyTorch: one sequence, forward, backward, AdamW.

Same model (transformers reads the GGUF with `gguf_file=`, dequantized to F32, or a Hugging
Face directory such as `sesa model export` writes), same token ids (the formula below), loss on
every position after the first, so the step-1 losses must agree with sesa's: that cross-checks
both losses, and that an exported model is the function sesa trained.

    python3 benches/train_torch.py GGUF_DIR --gguf GGUF_NAME --tokens 512 --method full --steps 3
    python3 benches/train_torch.py EXPORTED_DIR --steps 1

`--top-layers N` puts the LoRA adapters on the top N blocks only, as sesa's `top_layers`
(autograd then stops below them too).
"""
import argparse
import resource
import time

import torch
from transformers import AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("--gguf", default=None)
parser.add_argument("--tokens", type=int, default=512)
parser.add_argument("--method", choices=["full", "lora"], default="full")
parser.add_argument("--top-layers", type=int, default=None, help="LoRA on the top N blocks only")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(args.threads)
extra = {"gguf_file": args.gguf} if args.gguf else {}
model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, **extra)
vocabulary = model.config.vocab_size
if args.method == "lora":
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    layers = model.config.num_hidden_layers
    top = list(range(layers - min(args.top_layers, layers), layers)) if args.top_layers else None
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, layers_to_transform=top)
    model = get_peft_model(model, config)
trained = [p for p in model.parameters() if p.requires_grad]
print(f"training {args.tokens} tokens, {sum(p.numel() for p in trained)} trained parameters, torch {torch.__version__}")
ids = torch.tensor([[(i * 7919 + 13) % vocabulary for i in range(args.tokens)]])
optimizer = torch.optim.AdamW(trained, lr=1e-5, weight_decay=0.0)
model.train()
times = []
for step in range(args.steps):
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trained, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    times.append(seconds)
    print(f"step {step + 1}: {seconds:.2f} s ({args.tokens / seconds:.1f} tokens/s), loss {loss.item():.5f}")
steady = times[1:] or times
mean = sum(steady) / len(steady)
print(f"steady state: {mean:.2f} s per step, {args.tokens / mean:.1f} tokens/s")
print(f"peak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9:.2f} GB")
