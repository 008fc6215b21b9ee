"""Report of a learning run (`sesa run specs/learn.yaml`): greedy held-out exact match after the
warm start (the frozen policy) and at every evaluation after RL, per hop count, with bootstrap
95 % intervals; paired differences on the same questions, of each evaluation of the last step
against the frozen policy and against each other (memory on − memory off); the proposer's
valid-question rate, the searches behind its questions and mean p̂ per step; and where the time
of a step goes.

    python3 benches/learn_report.py runs/<run-id> [--plot learn.png]
    python3 benches/learn_report.py runs/<learn run> runs/<learn-memory run> --compare-plot arms.png
    python3 benches/learn_report.py runs/<arm> runs/<arm> --depth-plot depth.png   # benches/depth.sh

--depth-plot draws self-play as a curriculum, each run a line style: the searches behind the
accepted questions per requested hop count, p̂ and solver success per hop count, where the
solver's questions came from, the solver's searches per question by its hop count, and (on a
generated world) the share of proposals that ask for their target at the depth asked.

With several runs (arms of one experiment from the same warm start: memory off and on), each is
reported in turn, then every pair of evaluations made at the same step is compared question by
question (paired bootstrap), and --compare-plot draws their curves side by side.

Needs `pip install duckdb matplotlib`.
"""
import argparse
import os
import random

try:
    import duckdb
except ImportError as missing:
    raise SystemExit(f"{missing}: this script needs `pip install duckdb matplotlib`")

parser = argparse.ArgumentParser()
parser.add_argument("runs", nargs="+")
parser.add_argument("--plot", default=None, help="the first run's curves")
parser.add_argument("--compare-plot", default=None, help="every run's held-out curves, side by side")
parser.add_argument("--depth-plot", default=None, help="self-play per hop count and question source, every run")
parser.add_argument("--labels", default=None, help="comma-separated names of the runs in the plots")
parser.add_argument("--frozen-stage", default="warm_start_eval", help="the evaluation of the policy before RL")
parser.add_argument("--frozen-run", default=None,
                    help="take the frozen evaluation from this run when a run has none (RL started from its export)")
parser.add_argument("--benchmark", default="unseen_world",
                    help="the benchmark reported, where an evaluation ran several (e.g. a validation set of the training world)")
args = parser.parse_args()
DRAWS = 2000
HOPS = [("1", {1}), ("2", {2}), ("3-4", {3, 4}), ("all", {0, 1, 2, 3, 4})]


def bootstrap_mean(values, seed=0):
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(DRAWS))
    return means[int(0.025 * DRAWS)], means[int(0.975 * DRAWS) - 1]


def paired(pairs, seed=1):
    """Mean of paired differences and its bootstrap 95 % interval, in points."""
    rng = random.Random(seed)
    n = len(pairs)
    means = sorted(sum(rng.choice(pairs) for _ in range(n)) / n for _ in range(DRAWS))
    return sum(pairs) / n * 100, means[int(0.025 * DRAWS)] * 100, means[int(0.975 * DRAWS) - 1] * 100


def differences(later, earlier):
    """Per hop count: (name, mean, low, high, n) of later − earlier over the questions both answered."""
    rows = []
    for name, hops in HOPS:
        pairs = [later[q][1] - earlier[q][1] for q in earlier if q in later and earlier[q][0] in hops]
        if pairs:
            rows.append((name, *paired(pairs), len(pairs)))
    return rows


def print_differences(later, earlier):
    for name, mean, low, high, n in differences(later, earlier):
        print(f"  {name:>4} hops: {mean:+6.1f} points  95% [{low:+.1f}, {high:+.1f}]  (n = {n})")


def reader(run):
    def table(name, columns="*", where=""):
        return duckdb.sql(
            f"SELECT {columns} FROM read_parquet('{run}/tables/{name}/*/*.parquet', hive_partitioning = true, "
            f"filename = true) {where}"
        )

    return table


def evaluations(run):
    """A run's evaluations: answers by question, keyed by (step, stage, policy version)."""
    if not os.path.isdir(f"{run}/tables/evals"):
        return {}  # none yet: a run evaluated at its end, still running
    evals = reader(run)(
        "evals",
        "step, regexp_extract(filename, '([^/]+)\\.parquet$', 1) AS stage, question_id, hops, em, policy_version",
        f"WHERE benchmark = '{args.benchmark}'",
    ).fetchall()
    by_eval = {}
    for step, stage, qid, hops, em, version in evals:
        by_eval.setdefault((step, stage, version), {})[qid] = (hops, em)
    return by_eval


def report(run):
    """Prints one run's report; returns its evaluations by (step, stage, policy) and its curve."""
    table = reader(run)
    print(f"== {run}")
    by_eval = evaluations(run)
    if args.frozen_run and not any(k[1] == args.frozen_stage for k in by_eval):
        by_eval.update({k: v for k, v in evaluations(args.frozen_run).items() if k[1] == args.frozen_stage})
    frozen_key = next((k for k in by_eval if k[1] == args.frozen_stage), None)
    frozen = by_eval[frozen_key] if frozen_key else {}

    print(f"{'step':>4} {'stage':<16} {'policy':>6} " + " ".join(f"{h:>22}" for h, _ in HOPS))
    curve = []
    for key in sorted(by_eval):
        step, stage, version = key
        answers = by_eval[key]
        cells = []
        row = {"step": step, "stage": stage}
        for name, hops in HOPS:
            values = [em for h, em in answers.values() if h in hops]
            if not values:
                cells.append(f"{'-':>22}")
                continue
            low, high = bootstrap_mean(values)
            row[name] = (sum(values) / len(values), low, high)
            cells.append(f"{sum(values) / len(values):>6.3f} [{low:.3f},{high:.3f}]")
        curve.append(row)
        print(f"{step:>4} {stage:<16} {version:>6} " + " ".join(cells))

    # The last step's evaluations question by question: each against the frozen policy, and
    # against each other (memory on minus memory off).
    last_step = max((k[0] for k in by_eval if k[1] != args.frozen_stage), default=None)
    last_keys = sorted(k for k in by_eval if k[0] == last_step and k[1] != args.frozen_stage)
    if frozen:
        for key in last_keys:
            print(f"\n{key[1]} (step {key[0]}, policy {key[2]}) minus frozen {frozen_key[1]}, same questions, paired bootstrap:")
            print_differences(by_eval[key], frozen)
    for i, earlier in enumerate(last_keys):
        for later in last_keys[i + 1:]:
            print(f"\n{later[1]} minus {earlier[1]} (step {last_step}), same questions, paired bootstrap:")
            print_differences(by_eval[later], by_eval[earlier])

    if not os.path.isdir(f"{run}/tables/proposals"):
        print("no self-play steps: a warm start alone\n")
        return by_eval, curve
    metrics = {}
    for step, stage, metric, value in table("step_metrics", "step, stage, metric, value").fetchall():
        metrics.setdefault((stage, metric), {})[step] = value
    searches = table(
        "proposals", "step, avg(len(searches)) FILTER (WHERE valid), count(*) FILTER (WHERE valid)", "GROUP BY step"
    ).fetchall()
    searches = {s: (a, n) for s, a, n in searches}
    print(f"\n{'step':>4} {'valid':>6} {'verified':>8} {'searches':>8} {'mean p̂':>7} {'solver':>7} {'rollouts s':>10} "
          f"{'update s':>8} {'eval s':>7} {'step s':>7}")
    steps = sorted(metrics.get(("propose", "valid_rate"), {}))
    for step in steps:
        def m(stage, metric, scale=1.0):
            return metrics.get((stage, metric), {}).get(step, float("nan")) * scale

        rollout_s = sum(m(s, "wall_ms", 1e-3) for s in ("propose", "verify", "solve"))
        evaluation = sum(v.get(step, 0.0) for (stage, metric), v in metrics.items() if metric == "wall_ms" and "eval" in stage)
        total = sum(v.get(step, 0.0) for (stage, metric), v in metrics.items() if metric == "wall_ms") / 1e3
        print(f"{step:>4} {m('propose', 'valid_rate'):>6.2f} {m('verify', 'pass_rate'):>8.2f} "
              f"{searches.get(step, (0, 0))[0] or 0:>8.2f} {m('reward', 'mean_p_hat'):>7.2f} "
              f"{m('reward', 'solver_success'):>7.2f} {rollout_s:>10.0f} {m('update', 'wall_ms', 1e-3):>8.0f} "
              f"{evaluation / 1e3:>7.0f} {total:>7.0f}")

    if args.plot and run == args.runs[0]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(2, 2, figsize=(12, 8))
        axis = axes[0][0]
        rl = [r for r in curve if r["stage"] != args.frozen_stage]
        colours = {"1": "tab:blue", "2": "tab:orange", "3-4": "tab:red", "all": "black"}
        for name, _ in HOPS:
            frozen_row = next((r for r in curve if r["stage"] == args.frozen_stage and name in r), None)
            points = [(0, frozen_row[name])] if frozen_row else []
            points += [(r["step"], r[name]) for r in rl if name in r]
            if points:
                xs = [p[0] for p in points]
                axis.plot(xs, [p[1][0] for p in points], marker="o", color=colours[name], label=f"RL, {name} hops")
                axis.fill_between(xs, [p[1][1] for p in points], [p[1][2] for p in points], color=colours[name], alpha=0.12)
            if frozen_row:
                axis.axhline(frozen_row[name][0], color=colours[name], linestyle="--", linewidth=1)
        axis.set_title("held-out greedy EM (unseen world); step 0 and dashed: frozen")
        axis.set_xlabel("step")
        axis.set_ylabel("exact match")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)

        axis = axes[0][1]
        for (stage, metric), label in [(("propose", "valid_rate"), "valid proposals"), (("verify", "pass_rate"), "verified"),
                                       (("reward", "mean_p_hat"), "mean p̂"), (("reward", "solver_success"), "solver success")]:
            series = metrics.get((stage, metric), {})
            axis.plot(sorted(series), [series[s] for s in sorted(series)], marker=".", label=label)
        axis.set_title("self-play per step")
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)

        axis = axes[1][0]
        hops = table("proposals", "step, len(searches) AS n, count(*) AS c", "WHERE valid GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        for n in sorted({h[1] for h in hops}):
            series = {s: c for s, k, c in hops if k == n}
            axis.plot(sorted(series), [series[s] for s in sorted(series)], marker=".", label=f"{n} searches")
        axis.set_title("valid proposer questions by searches made")
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)

        axis = axes[1][1]
        for metric in ("solver_loss", "proposer_loss", "solver_kl", "solver_clip_fraction"):
            series = metrics.get(("update", metric), {})
            axis.plot(sorted(series), [series[s] for s in sorted(series)], marker=".", label=metric)
        axis.set_title("update")
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    print()
    return by_eval, curve


reports = {run: report(run) for run in args.runs}
if len(args.runs) > 1:
    print("Between runs, the same questions at the same step, paired bootstrap (points; later run minus earlier):")
    for i, first in enumerate(args.runs):
        for second in args.runs[i + 1:]:
            a, b = reports[first][0], reports[second][0]
            for key_a in sorted(a):
                for key_b in sorted(k for k in b if k[0] == key_a[0]):
                    cells = [f"{name} {mean:+.1f} [{low:+.1f}, {high:+.1f}]"
                             for name, mean, low, high, _ in differences(b[key_b], a[key_a])]
                    print(f"  step {key_a[0]:>2}: {second.rstrip('/').split('/')[-1]} {key_b[1]} − "
                          f"{first.rstrip('/').split('/')[-1]} {key_a[1]}: " + "; ".join(cells))

def series_of(run, stage, metric):
    rows = reader(run)("step_metrics", "step, value", f"WHERE stage = '{stage}' AND metric = '{metric}' ORDER BY step")
    return rows.fetchall()


def depth_plot(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 4, figsize=(21, 8))
    lines = ["-", "--", ":", "-."]
    colours = {1: "tab:blue", 2: "tab:orange", 3: "tab:red", 4: "tab:purple"}
    labels = args.labels.split(",") if args.labels else [r.rstrip("/").split("/")[-1] for r in args.runs]

    def draw(axis, points, **style):
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", **style)

    for line, run, label in zip(lines, args.runs, labels):
        table = reader(run)
        def searches_by_hops(trajectories, hops, where):
            """Per step and hop count, the mean searches of `trajectories` (joined to the
            verification of their question)."""
            rows = duckdb.sql(
                f"SELECT t.step, {hops}, avg(len(t.searches)) FROM ({table(trajectories).sql_query()}) t "
                f"JOIN ({table('verifications').sql_query()}) v ON t.step = v.step AND t.item = v.item "
                f"WHERE {where} GROUP BY 1, 2 ORDER BY 1, 2"
            ).fetchall()
            return {h: [(step, a) for step, k, a in rows if k == h] for h in sorted({k for _, k, _ in rows})}

        # Accepted questions: the proposer's searches per requested hop count.
        for hops, points in searches_by_hops("proposals", "t.hops", "v.source = 'proposed'").items():
            draw(axes[0][0], points, linestyle=line, color=colours.get(hops), label=f"{label}: asked {hops}")
        for hops in (1, 2, 3, 4):
            draw(axes[0][1], series_of(run, "reward", f"p_hat_h{hops}"), linestyle=line, color=colours[hops],
                 label=f"{label}: {hops} hops")
            draw(axes[0][2], series_of(run, "reward", f"solver_success_h{hops}"), linestyle=line, color=colours[hops],
                 label=f"{label}: {hops} hops")
            draw(axes[0][3], series_of(run, "reward", f"solver_misstep_rate_h{hops}"), linestyle=line,
                 color=colours[hops], label=f"{label}: {hops} hops")
            # Only on a generated world: questions that ask for their target at the depth asked.
            draw(axes[1][3], series_of(run, "propose", f"right_rate_h{hops}"), linestyle=line, color=colours[hops],
                 label=f"{label}: {hops} hops")
        for source, colour in [("proposed", "tab:green"), ("reused", "tab:olive"), ("substitute", "tab:gray"),
                               ("dummy", "black")]:
            draw(axes[1][0], series_of(run, "verify", f"source_{source}"), linestyle=line, color=colour,
                 label=f"{label}: {source}")
        searched = searches_by_hops("rollouts", "v.hops", "v.hops IS NOT NULL AND NOT t.guided")
        for hops, points in searched.items():
            draw(axes[1][1], points, linestyle=line, color=colours.get(hops), label=f"{label}: {hops} hops")
        draw(axes[1][2], series_of(run, "propose", "valid_rate"), linestyle=line, color="tab:blue", label=f"{label}: valid")
        draw(axes[1][2], series_of(run, "verify", "pass_rate"), linestyle=line, color="tab:orange", label=f"{label}: verified")
        draw(axes[1][2], series_of(run, "reward", "guided_success"), linestyle=line, color="tab:red",
             label=f"{label}: guided rollouts' success")
    titles = [["searches behind accepted questions, by hops asked", "p̂ of proposed questions, by hops",
               "solver success (unguided rollouts), by hops",
               "rollouts with a misstep (unguided), by hops"],
              ["share of the solver's questions, by source", "solver searches per question, by hops",
               "proposals valid and verified", "proposals that ask for their target, by hops asked"]]
    for row, names in zip(axes, titles):
        for axis, title in zip(row, names):
            if title is None:
                axis.set_visible(False)
                continue
            axis.set_title(title, fontsize=10)
            axis.set_xlabel("step")
            axis.grid(alpha=0.3)
            if axis.get_legend_handles_labels()[0]:
                axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")


if args.depth_plot:
    depth_plot(args.depth_plot)

if args.compare_plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(HOPS), figsize=(4 * len(HOPS), 3.6), sharey=True)
    styles = ["tab:blue", "tab:green", "tab:purple", "tab:brown"]
    labels = args.labels.split(",") if args.labels else [r.rstrip("/").split("/")[-1].rsplit("-", 2)[0] for r in args.runs]
    for axis, (name, _) in zip(axes, HOPS):
        for colour, run, label in zip(styles, args.runs, labels):
            curve = reports[run][1]
            # The frozen policy is step 0 of the RL curve, and a dashed line across.
            frozen_row = next((r for r in curve if r["stage"] == args.frozen_stage and name in r), None)
            points = [(0, frozen_row[name])] if frozen_row else []
            points += [(r["step"], r[name]) for r in curve if r["stage"] != args.frozen_stage and name in r]
            if points:
                xs = [p[0] for p in points]
                axis.plot(xs, [p[1][0] for p in points], marker="o", color=colour, label=f"{label}: RL")
                axis.fill_between(xs, [p[1][1] for p in points], [p[1][2] for p in points], color=colour, alpha=0.12)
            if frozen_row:
                axis.axhline(frozen_row[name][0], color=colour, linestyle="--", linewidth=1, label=f"{label}: frozen")
        axis.set_title(f"{name} hops")
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("held-out greedy EM")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.compare_plot, dpi=100)
    print(f"wrote {args.compare_plot}")
