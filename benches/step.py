#!/usr/bin/env python3
"""Time one RL step of specs/learn.yaml by part, for several variants, alternated.

Each variant runs one step (propose, verify, solve, reward, update; no warm start, no
evaluation) from the same warm-start export and seed, so every variant whose first update
does not change what step 1 samples (LoRA's B starts at zero) trains on the same batch. The
variants run in turn, ROUNDS times, so the machine's drift falls on all of them alike; run it
on a quiet machine.

    python3 benches/step.py --warm runs/warm --sesa target/debug/sesa \\
        --variant every=trainer.update_method=null --variant top8=

A variant is LABEL=OVERRIDES: `--set` values separated by `;` (none: the spec as shipped);
`--binary LABEL=PATH` runs that variant with another build (two builds of a change that must
not change what is computed, only how fast). Prints a row per run (seconds; rows: the
update's trained rows, rows/s: per second of the update; peak GB: the run's resident peak),
the median per variant, and whether the variants of each round sampled the same tokens.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

try:
    import duckdb
except ImportError:
    sys.exit("benches/step.py reads the run's tables with DuckDB: python3 -m pip install duckdb")

PARTS = [
    ("propose", "propose", "wall_ms"),
    ("verify", "verify", "wall_ms"),
    ("solve", "solve", "wall_ms"),
    ("update", "update", "wall_ms"),
    ("inputs", "update", "block_inputs_ms"),
    ("fwd+bwd", "update", "forward_backward_ms"),
    ("reference", "update", "reference_ms"),
    ("optimizer", "update", "optimizer_ms"),
    ("checkpoint", "update", "checkpoint_ms"),
    ("serve", "update", "serve_ms"),
]


def run_step(sesa, spec, warm, overrides, store, extra):
    """Runs one step; returns (run directory, peak resident GB of the process)."""
    args = [sesa, "run", spec, "--store", store, "--set", "steps=1",
            "--set", f"model.model={warm}", "--set", "model.dtype=int8",
            "--set", "stages.warmup=null", "--set", "stages.warm_start_eval=null",
            "--set", "stages.propose.after=[]", "--set", "stages.eval=null"]
    for override in extra + overrides:
        args += ["--set", override]
    with open(os.path.join(store, "run.log"), "w") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        # wait4 gives this child's own peak memory (getrusage would give every child's).
        _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(args)} failed; its log: {store}/run.log")
    runs = [d for d in os.listdir(store) if os.path.isdir(os.path.join(store, d))]
    if len(runs) != 1:
        sys.exit(f"expected one run in {store}, found {runs}")
    # ru_maxrss is in kilobytes on Linux.
    return os.path.join(store, runs[0]), usage.ru_maxrss * 1024 / 1e9


def parts(run):
    metrics = duckdb.sql(
        f"select stage, metric, value from read_parquet('{run}/tables/step_metrics/step=1/*.parquet', "
        "union_by_name = true)").fetchall()
    values = {(stage, metric): value for stage, metric, value in metrics}
    row = {label: values.get((stage, metric), 0.0) / 1000 for label, stage, metric in PARTS}
    row["step"] = sum(row[p] for p in ("propose", "verify", "solve", "update"))
    row["rows"] = values.get(("update", "tokens"), 0.0)
    # The update's throughput, the figure the trainer's speed targets are stated in.
    row["rows/s"] = row["rows"] / row["update"] if row["update"] else 0.0
    return row


def sampled(run):
    """A digest of every token the step sampled (proposals and rollouts, in order)."""
    digests = []
    for table in ("proposals", "rollouts"):
        digests.append(duckdb.sql(
            f"select md5(string_agg(cast(token_ids as varchar), ';' order by item, {'rollout' if table == 'rollouts' else 'item'})) "
            f"from read_parquet('{run}/tables/{table}/step=1/*.parquet', union_by_name = true)").fetchall()[0][0])
    return tuple(digests)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm", required=True, help="a warm-start export (Hugging Face directory)")
    parser.add_argument("--sesa", default="target/release/sesa")
    parser.add_argument("--spec", default="specs/learn.yaml")
    parser.add_argument("--variant", action="append", required=True, help="LABEL=OVERRIDES")
    parser.add_argument("--set", action="append", default=[], dest="extra",
                        help="an override every variant gets")
    parser.add_argument("--binary", action="append", default=[], help="LABEL=PATH: this variant's sesa")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--store", help="where the runs go (default: a temporary directory)")
    args = parser.parse_args()
    variants = []
    for variant in args.variant:
        label, _, overrides = variant.partition("=")
        variants.append((label, [o.strip() for o in overrides.split(";") if o.strip()]))
    binaries = dict(b.partition("=")[::2] for b in args.binary)
    unknown = set(binaries) - {label for label, _ in variants}
    if unknown:
        sys.exit(f"--binary names no variant: {', '.join(sorted(unknown))}")
    root = args.store or tempfile.mkdtemp(prefix="sesa-step-")
    columns = ["step"] + [label for label, _, _ in PARTS] + ["rows", "rows/s", "peak GB"]
    print(f"{'variant':<12} {'round':>5} " + " ".join(f"{c:>10}" for c in columns), flush=True)
    results = {label: [] for label, _ in variants}
    differing = []
    for round_ in range(1, args.rounds + 1):
        tokens = {}
        for label, overrides in variants:
            store = os.path.join(root, f"{label}-{round_}")
            os.makedirs(store)
            run, peak = run_step(binaries.get(label, args.sesa), args.spec, args.warm, overrides, store, args.extra)
            tokens[label] = sampled(run)
            row = parts(run)
            row["peak GB"] = peak
            results[label].append(row)
            print(f"{label:<12} {round_:>5} " + " ".join(f"{row[c]:>10.1f}" for c in columns), flush=True)
        if len(set(tokens.values())) > 1:
            differing.append(round_)
    print("medians:")
    for label, rows in results.items():
        medians = {c: statistics.median(r[c] for r in rows) for c in columns}
        print(f"{label:<12} {'':>5} " + " ".join(f"{medians[c]:>10.1f}" for c in columns))
    if differing:
        print(f"the variants sampled different tokens in round(s) {differing}")
    else:
        print("every variant sampled the same tokens in each round")
    print(f"runs under {root}")


if __name__ == "__main__":
    main()
