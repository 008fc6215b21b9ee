"""Report of a warm-start run (`sesa run specs/warmup.yaml`): greedy exact match before and
after, per benchmark and hop count, with bootstrap 95 % intervals, and the training loss curve.

    python3 benches/warmup_report.py runs/<run-id> [--plot loss.png]

Needs `pip install duckdb matplotlib`.
"""
import argparse
import random

try:
    import duckdb
except ImportError as missing:
    raise SystemExit(f"{missing}: this script needs `pip install duckdb matplotlib`")

parser = argparse.ArgumentParser()
parser.add_argument("run")
parser.add_argument("--plot", default=None)
args = parser.parse_args()
tables = f"{args.run}/tables"


def bootstrap(values, draws=2000, seed=0):
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


evals = duckdb.sql(
    f"SELECT regexp_extract(filename, '([^/]+)\\.parquet$', 1) AS stage, benchmark, hops, em, policy_version "
    f"FROM read_parquet('{tables}/evals/*/*.parquet', filename = true)"
).fetchall()
groups = {}
for stage, benchmark, hops, em, version in evals:
    groups.setdefault((benchmark, stage, version), {}).setdefault(hops, []).append(em)
print(f"{'benchmark':<14} {'stage':<8} {'policy':>6} {'hops':>5} {'n':>4} {'EM':>6}  95% interval")
for (benchmark, stage, version), by_hops in sorted(groups.items()):
    for hops, values in sorted(by_hops.items()) + [("all", [v for vs in by_hops.values() for v in vs])]:
        low, high = bootstrap(values)
        print(f"{benchmark:<14} {stage:<8} {version:>6} {hops!s:>5} {len(values):>4} {sum(values) / len(values):>6.3f}  [{low:.3f}, {high:.3f}]")

steps = duckdb.sql(
    f"SELECT optimizer_step, sum(loss * trained_tokens) / sum(trained_tokens) AS loss, sum(tokens) AS tokens, "
    f"sum(wall_ms) AS ms FROM read_parquet('{tables}/train_steps/*/*.parquet') GROUP BY 1 ORDER BY 1"
).fetchall()
if steps:
    tokens = sum(s[2] for s in steps)
    seconds = sum(s[3] for s in steps) / 1e3
    print(f"\ntraining: {len(steps)} optimizer steps, {tokens} tokens, {seconds:.0f} s forward+backward "
          f"({tokens / seconds:.0f} tokens/s), loss {steps[0][1]:.3f} -> {steps[-1][1]:.3f}")
if args.plot and steps:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot([s[0] for s in steps], [s[1] for s in steps], linewidth=1)
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("loss (mean NLL of trained tokens)")
    axis.set_yscale("log")
    axis.set_title("Warm start of SmolLM2-135M on world demonstrations")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    print(f"wrote {args.plot}")
