#!/usr/bin/env python3
"""A reference external trainer for sesa's `update` stage, in PyTorch: a starting point for
wiring verl, OpenRLHF or your own trainer to sesa. See docs/external-trainer.md.

sesa runs it as `COMMAND... MANIFEST` with SESA_MANIFEST, SESA_RESULT and SESA_CHECKPOINT_DIR
set. It reads the step's batch (Parquet: one row per trajectory, with sesa's advantages),
trains a Hugging Face causal LM with the same clipped objective as sesa's in-process trainer
(PPO ratio clipped at 1 - clip_low and 1 + clip_high, a dual clip for negative advantages, a
k3 KL penalty to the initial model, token-mean over each mini-batch), saves the new weights to
the checkpoint directory and writes result.json. Exit 0 only when all of that succeeded.

    python3 grpo_trainer.py --model INITIAL_HF_DIR [--proposer-model PROPOSER_HF_DIR] MANIFEST
    # in a spec:
    #   update: {kind: update, optimizer: {...},
    #            external: {command: [python3, examples/external_trainer/grpo_trainer.py,
    #                                 --model, /models/initial], dir: external/}}

When the spec gives the proposer its own model (`proposer_model:`), sesa runs the trainer once
per model and each manifest's "model" says which ("model" or "proposer_model"): the proposer's
starts from --proposer-model.

Under torchrun it trains data-parallel: each of the N processes takes every N-th trajectory of
each mini-batch, the gradients are summed across processes before every optimizer step (NCCL on
GPUs, gloo on CPUs), and the token mean is over the whole mini-batch, so the N processes take the
same steps as one (to float rounding) and hold the same weights; rank 0 writes the checkpoint and
result.json. Every process holds the whole model (plain data parallelism: a model too large for
one GPU needs FSDP, as verl has).

    torchrun --nproc_per_node 8 grpo_trainer.py --model INITIAL_HF_DIR MANIFEST

Like `sesa train-external`, it keeps no optimizer state between steps (AdamW starts afresh);
a trainer that runs for the whole run would keep it.
"""

import argparse
import json
import math
import os
import sys

try:
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as missing:
    raise SystemExit(f"{missing}: the reference trainer needs `pip install torch transformers pyarrow`")


def split(n, size):
    """Contiguous mini-batches of at most `size` (near-equal lengths), as sesa splits them."""
    parts = max(1, math.ceil(n / max(1, size or n)))
    return [range(p * n // parts, (p + 1) * n // parts) for p in range(parts) if (p + 1) * n // parts > p * n // parts]


def lr_at(optimizer, step, total):
    """sesa's schedule: linear warmup, then constant or cosine."""
    warmup, lr = optimizer.get("warmup_steps", 0), optimizer["lr"]
    if step <= warmup:
        return lr * step / (warmup + 1)
    if optimizer.get("schedule", "constant") == "constant":
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    low = optimizer.get("min_lr", 0.0)
    return low + 0.5 * (lr - low) * (1 + math.cos(math.pi * progress))


def token_logprobs(model, rows, temperature):
    """Per row, the log-probabilities of its trained response tokens (loss mask 1)."""
    out = []
    device = next(model.parameters()).device
    for row in rows:
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]], device=device)
        logits = model(ids).logits[0, :-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        start = len(row["prompt_ids"]) - 1
        mask = torch.tensor(row["loss_mask"], dtype=torch.bool, device=device)
        out.append(logp[start:][mask])
    return out


def clipped_loss(logp, old, ref, advantage, loss):
    """The clipped surrogate with a dual clip and the k3 KL, per token (sesa's objective)."""
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    unclipped = -advantage * ratio
    clipped = -advantage * torch.clamp(ratio, 1 - loss["clip_low"], 1 + loss["clip_high"])
    policy = torch.maximum(unclipped, clipped)
    if advantage < 0:
        policy = torch.minimum(policy, torch.full_like(policy, -advantage * loss["clip_dual"]))
    kl = torch.zeros_like(policy)
    if ref is not None and loss["kl_coef"] > 0:
        log_ratio = torch.clamp(ref - logp, -20, 20)
        kl = torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10, 10)
    return policy + loss["kl_coef"] * kl, policy, kl, (clipped > unclipped)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest")
    parser.add_argument("--model", required=True, help="the initial model (HF directory): KL reference and start")
    parser.add_argument("--proposer-model", help="the proposer's own initial model, for manifests of `proposer_model`")
    parser.add_argument("--result", help="override the manifest's result path")
    parser.add_argument("--checkpoint-dir", help="override the manifest's checkpoint directory")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when PyTorch sees a GPU)")
    args = parser.parse_args()
    torch.manual_seed(0)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    # F32 products in full precision on the GPU too (no TF32), so its numbers match sesa's.
    torch.backends.cuda.matmul.allow_tf32 = False

    def summed(values, op=None):
        """`values` (floats) summed (or reduced by `op`) over the processes."""
        if world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
        return t.tolist()

    manifest = json.load(open(args.manifest))
    if manifest["contract"] not in (1, 2):
        sys.exit(f"contract {manifest['contract']} is not one of the supported 1 and 2")
    which = manifest.get("model", "model")
    if which == "model":
        initial = args.model
    elif which == "proposer_model":
        if not args.proposer_model:
            sys.exit(f"{args.manifest} trains the proposer's own model: give its initial weights with --proposer-model")
        initial = args.proposer_model
    else:
        sys.exit(f"{args.manifest}: unknown model {which!r} (this trainer knows 'model' and 'proposer_model')")
    result_path = args.result or manifest["result"]
    checkpoint_dir = args.checkpoint_dir or manifest["checkpoint_dir"]
    table = pq.read_table(manifest["batch"]).to_pylist()
    start = manifest.get("previous_checkpoint") or initial
    model = AutoModelForCausalLM.from_pretrained(start, torch_dtype=torch.float32).to(device)
    loss_settings, optimizer_settings = manifest["loss"], manifest["optimizer"]
    reference = None
    if loss_settings["kl_coef"] > 0:
        reference = AutoModelForCausalLM.from_pretrained(initial, torch_dtype=torch.float32).to(device).eval()
    betas = optimizer_settings.get("betas", [0.9, 0.999])
    adam = torch.optim.AdamW(
        model.parameters(),
        lr=optimizer_settings["lr"],
        betas=tuple(betas),
        eps=optimizer_settings.get("eps", 1e-8),
        weight_decay=optimizer_settings.get("weight_decay", 0.0),
    )
    temperature, epochs = manifest["temperature"], manifest["ppo_epochs"]
    batches = {role: [r for r in table if r["role"] == role and r["prompt_ids"]] for role, _ in manifest["roles"]}
    total = sum(len(split(len(rows), manifest["mini_batch"])) * epochs for rows in batches.values())
    step, metrics = 0, {}
    for role, _ in manifest["roles"]:
        rows = batches[role]
        if not rows or all(r["advantage"] == 0 for r in rows):
            metrics[role] = {"optimizer_steps": 0}
            continue
        # This process's share: every world-th trajectory.
        mine = [i for i in range(len(rows)) if i % world == rank]
        with torch.no_grad():
            old = dict(zip(mine, token_logprobs(model, [rows[i] for i in mine], temperature)))
            ref = {}
            if reference is not None:
                ref = dict(zip(mine, token_logprobs(reference, [rows[i] for i in mine], temperature)))
        gaps = [abs(old[i].cpu() - torch.tensor(rows[i]["old_logprobs"])[torch.tensor(rows[i]["loss_mask"], dtype=torch.bool)]) for i in mine]
        gap = torch.cat(gaps) if gaps else torch.zeros(0)
        gap_sum, gap_count = summed([gap.sum().item(), float(gap.numel())])
        (gap_max,) = summed([gap.max().item() if gap.numel() else 0.0], dist.ReduceOp.MAX if world > 1 else None)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "grad_norm": 0.0, "lr": 0.0}
        steps = 0
        for _ in range(epochs):
            for chunk in split(len(rows), manifest["mini_batch"]):
                step += 1
                lr = lr_at(optimizer_settings, step, total)
                for group in adam.param_groups:
                    group["lr"] = lr
                local = [i for i in chunk if i % world == rank]
                current = token_logprobs(model, [rows[i] for i in local], temperature)
                # The token mean over the whole mini-batch, whichever process holds a token.
                (tokens,) = summed([float(sum(len(c) for c in current))])
                terms = [clipped_loss(c, old[i], ref.get(i), rows[i]["advantage"], loss_settings) for c, i in zip(current, local)]
                adam.zero_grad()
                if terms:
                    loss = sum(t[0].sum() for t in terms) / tokens
                    loss.backward()
                if world > 1:
                    for parameter in model.parameters():
                        if parameter.grad is None:
                            parameter.grad = torch.zeros_like(parameter)
                        dist.all_reduce(parameter.grad)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optimizer_settings.get("clip_norm", 0) or float("inf"))
                adam.step()
                steps += 1
                parts = [sum(t[k].sum().item() for t in terms) for k in range(4)] + [-sum(c.sum().item() for c in current)]
                loss_sum, pg_sum, kl_sum, clipped_sum, entropy_sum = summed(parts)
                sums["loss"] += loss_sum / tokens
                sums["pg_loss"] += pg_sum / tokens
                sums["kl"] += kl_sum / tokens
                sums["clip_fraction"] += clipped_sum / tokens
                sums["entropy"] += entropy_sum / tokens
                sums["grad_norm"] += float(norm)
                sums["lr"] += lr
        metrics[role] = {k: v / steps for k, v in sums.items()}
        metrics[role].update(
            optimizer_steps=steps,
            tokens=sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows) * epochs,
            logprob_gap=gap_sum / max(gap_count, 1.0),
            logprob_gap_max=gap_max,
        )
    if rank != 0:
        dist.barrier()
        dist.destroy_process_group()
        return
    model.cpu().save_pretrained(checkpoint_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(initial).save_pretrained(checkpoint_dir)
    partial = result_path + ".partial"
    json.dump({"checkpoint": checkpoint_dir, "metrics": metrics}, open(partial, "w"), indent=2)
    os.replace(partial, result_path)
    print(f"trained on {device}" + (f", {world} processes" if world > 1 else ""))
    for role, m in metrics.items():
        print(f"{role}: " + ", ".join(f"{k} {v:.6g}" for k, v in m.items()))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
