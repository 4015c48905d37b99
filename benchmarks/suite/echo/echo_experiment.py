"""GRPO vs GRPO + ECHO on a task's config: held-out success vs samples, held-out environment-token CE.

    python benchmarks/run.py echo                        # the calculator: sweep lambda (seed 0), then 3 seeds
                                                         # of GRPO and of the best lambda; ~25 min on 2 cores
    python benchmarks/run.py echo --config examples/grid/config.yaml --sweep 0.005 0.05 0.2 \\
        --normalizations seq_mean_token_mean seq_mean_token_sum_norm --seeds 0 1 2 3 4      # the grid task
    python benchmarks/run.py echo --config examples/grid/config.yaml --report-only   # redraw from disk
    python benchmarks/run.py echo --config examples/grid/delayed.yaml --pick reach --schedule linear \
        --seeds 0 1 2 3 4                                # round 5: observations one move late, 80 steps
    python benchmarks/run.py echo --config examples/grid/delayed.yaml --name grid-delayed-wm --sweep 0.05 \
        --seeds 0 1 -- model.path=builtin:tiny-grid-delayed-wm  # round 5's ablation: a warm-up that predicts them
    python benchmarks/run.py echo --sweep 0.01 0.1 --seeds 0 1 2 3 -- run.steps=80   # other settings

Each run is `agentrl-ray train <config> echo.coeff=L run.seed=S` (the example's run, nothing else
changed), in its own Ray instance, one after another; with AGENTRL_HEAVY_LOCK=<file> set each run is wrapped in
`flock <file>`, so a machine shared with other heavy jobs runs one at a time and the others interleave between runs.
Order: GRPO at the first seed, the lambda sweep at that seed, the normalizations and the decaying schedule (at the
best lambda, first seed), then the remaining seeds of GRPO and of the best ECHO variant. A run already on disk (its
summary.json) is reused, so an interrupted experiment continues where it stopped.

Held-out success and held-out environment-token CE come from the run's own evaluations (`eval/success`,
`eval/echo_ce` in metrics.jsonl, every `run.eval_every` steps on the same held-out prompts). The lambda for the
seeded comparison is the sweep value with the best mean held-out success over the run's evaluations after step 0
(area under the curve), so a lambda that gets there sooner wins over one that only ends level; with `--pick reach`
(round 5, fixed before its runs) the one with the fewest samples to the first seed's GRPO peak, the mean held-out
success breaking ties. `--schedule linear` adds, at the picked lambda, a run whose lambda decays linearly to 0 over
`--decay-steps` steps; it replaces the constant lambda in the seeded arm when the same pick prefers it.

Writes runs/echo/<name>/ (the calculator) or runs/echo-<task>/<name>/ (another config) for each run. The calculator
writes docs/echo.md's head and docs/echo.png; another task writes its own section of docs/echo.md (between
`<!-- echo:<task> -->` markers, the calculator's part untouched) and docs/echo-<task>.png. `--report-only` reports
the runs that exist (fewer seeds than asked are reported as such).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import yaml
from results_path import ROOT

CALCULATOR = ROOT / "examples/calculator/config.yaml"
ANALYSIS = "<!-- analysis: kept when the tables are regenerated -->"
COEFF_KEY = "echo.coeff"
NORM_KEY = "echo.normalization"
DEFAULT_NORM = "token_mean"
SCHEDULES = ("linear",)  # variants that change echo.schedule rather than echo.normalization


class Experiment:
    """Where a config's runs go and how each is started."""

    def __init__(self, config: Path, extra: list[str], decay_steps: int = 40, name: str | None = None) -> None:
        self.config = config.resolve()
        self.extra = extra
        self.decay_steps = decay_steps
        self.task = name or ("calculator" if self.config == CALCULATOR.resolve() else task_name(self.config))
        self.out = ROOT / "runs" / ("echo" if self.task == "calculator" else f"echo-{self.task}")

    def run_dir(self, coeff: float, seed: int, norm: str = DEFAULT_NORM) -> Path:
        return self.out / run_name(coeff, seed, norm)

    def variant_overrides(self, norm: str) -> list[str]:
        """`norm` names a run's variant: an echo.normalization, or `linear` (lambda decays to 0 over decay_steps)."""
        if norm == DEFAULT_NORM:
            return []
        if norm in SCHEDULES:
            return ["echo.schedule=linear", "echo.final_coeff=0", f"echo.decay_steps={self.decay_steps}"]
        return [f"{NORM_KEY}={norm}"]

    def train(self, coeff: float, seed: int, norm: str = DEFAULT_NORM) -> Path:
        run_dir = self.run_dir(coeff, seed, norm)
        if (run_dir / "summary.json").exists():
            print(f"[echo] {run_dir.name}: done before, reusing", flush=True)
            return run_dir
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)  # an interrupted run: start it again
        cmd = [
            sys.executable,
            "-m",
            "agentrl_ray",
            "train",
            str(self.config),
            f"{COEFF_KEY}={coeff}",
            *self.variant_overrides(norm),
            f"run.seed={seed}",
            f"run.output_dir={self.out}",
            f"run.name={run_dir.name}",
            "run.checkpoint_every=0",
            "run.keep_checkpoints=1",
            *self.extra,
        ]
        print(f"[echo] {run_dir.name}: {' '.join(cmd[3:])}", flush=True)
        lock = os.environ.get("AGENTRL_HEAVY_LOCK")
        # One run per lock hold: other heavy jobs on a shared machine get their turn between runs.
        subprocess.run(["flock", lock, *cmd] if lock else cmd, check=True, cwd=ROOT)
        return run_dir


def task_name(config: Path) -> str:
    name = (yaml.safe_load(config.read_text()) or {}).get("run", {}).get("name")
    return str(name or config.parent.name)


def run_name(coeff: float, seed: int, norm: str = DEFAULT_NORM) -> str:
    return f"lam{coeff:g}-seed{seed}" if norm == DEFAULT_NORM else f"lam{coeff:g}-{norm}-seed{seed}"


def curve(run_dir: Path) -> list[dict]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    for r in records:  # runs recorded before the ECHO metrics took one name (stored results) call it env_token_ce
        if "eval/env_token_ce" in r:
            r.setdefault("eval/echo_ce", r.pop("eval/env_token_ce"))
    return [r for r in records if "eval/success" in r]


def peak_entropy(run_dir: Path) -> float:
    """The policy's largest training-batch entropy over the run (a world-model gradient that destabilizes the policy
    shows here first: the learner's health monitor flags entropy rising above its baseline)."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return max((r["loss/entropy"] for r in records if "loss/entropy" in r), default=float("nan"))


def auc(run_dir: Path) -> float:
    return statistics.mean(r["eval/success"] for r in curve(run_dir) if r["step"] > 0)


def samples_to_reach(run_dir: Path, target: float) -> int | None:
    for r in curve(run_dir):
        if r["eval/success"] >= target - 1e-9:
            return r["samples"]
    return None


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    t95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}
    if len(xs) < 2:
        return statistics.mean(xs), float("nan")
    return statistics.mean(xs), t95.get(len(xs), 2.0) * statistics.stdev(xs) / len(xs) ** 0.5


def ratio_ci(a: list[float], b: list[float], n: int = 10_000) -> tuple[float, float, float]:
    """mean(a) / mean(b) and its 95% bootstrap interval (seeds resampled within each arm)."""
    rng = random.Random(0)
    boots = sorted(
        statistics.mean(rng.choices(a, k=len(a))) / statistics.mean(rng.choices(b, k=len(b))) for _ in range(n)
    )
    return statistics.mean(a) / statistics.mean(b), boots[int(0.025 * n)], boots[int(0.975 * n)]


def reach_or_censored(run_dir: Path, target: float) -> tuple[float, bool]:
    """Samples to the first evaluation at or above `target`; a run that never gets there counts as one evaluation
    interval past its end (a lower bound: the ratio below is then conservative for the arm that misses)."""
    c = curve(run_dir)
    hit = samples_to_reach(run_dir, target)
    if hit is not None:
        return float(hit), False
    return float(c[-1]["samples"] + (c[-1]["samples"] - c[-2]["samples"])), True


def mean_curve(dirs: list[Path], key: str) -> list[tuple[int, float]]:
    curves = [curve(d) for d in dirs]
    n = min(len(c) for c in curves)
    return [(curves[0][i]["samples"], statistics.mean(c[i].get(key, float("nan")) for c in curves)) for i in range(n)]


def arm_label(coeff: float, variant: str = DEFAULT_NORM, decay_steps: int = 0) -> str:
    if coeff == 0:
        return "GRPO"
    if variant in SCHEDULES:
        return f"ECHO λ={coeff:g}→0 ({variant}, {decay_steps} steps)"
    return f"ECHO λ={coeff:g}" + ("" if variant == DEFAULT_NORM else f" ({variant})")


def pick(candidates: dict, target: float, by: str):
    """The candidate (key -> run dir) a seed-0 comparison prefers: the best mean held-out success (`auc`), or the
    fewest samples to `target`, mean held-out success breaking ties (`reach`)."""
    if by == "auc":
        return max(candidates, key=lambda k: auc(candidates[k]))
    return min(candidates, key=lambda k: (reach_or_censored(candidates[k], target)[0], -auc(candidates[k])))


def tables(
    exp: Experiment,
    runs: dict[float, list[Path]],
    sweep: dict[float, Path],
    norms: dict[str, Path],
    best: float,
    arm: str = DEFAULT_NORM,
    by: str = "auc",
) -> list[str]:
    def ms(xs: list[float]) -> str:
        m, h = mean_ci(xs)
        return f"{m:.3f} ± {statistics.pstdev(xs):.3f} [±{h:.3f}]" if len(xs) > 1 else f"{m:.3f}"

    def ce(c: list[dict], i: int) -> str:
        return f"{c[i].get('eval/echo_ce', float('nan')):.2f}"

    seed0 = min(int(d.name.rpartition("seed")[2]) for d in sweep.values())
    target0 = max(r["eval/success"] for r in curve(sweep[0.0])) if 0.0 in sweep else float("nan")
    reach = by == "reach" and 0.0 in sweep

    def to_target(d: Path) -> str:  # the `reach` pick's column
        if not reach:
            return ""
        hit, cens = reach_or_censored(d, target0)
        return f" {'>' if cens else ''}{hit:.0f} |"

    lines = [
        f"## λ sweep (seed {seed0})",
        "",
        "| λ | held-out success, final | peak | mean over evals after step 0 | held-out env-token CE, start → end |"
        + (" samples to GRPO's seed-0 peak |" if reach else ""),
        "|---|---|---|---|---|" + ("---|" if reach else ""),
    ]
    for coeff, d in sorted(sweep.items()):
        c = curve(d)
        peak = max(r["eval/success"] for r in c)
        lines.append(
            f"| {coeff:g} | {c[-1]['eval/success']:.3f} | {peak:.3f} | {auc(d):.3f} | {ce(c, 0)} → {ce(c, -1)} |"
            + to_target(d)
        )
    if norms:
        schedule_only = all(n in SCHEDULES for n in norms)
        lines += [
            "",
            f"## {'λ schedule' if schedule_only else 'World-loss normalization'} (λ = {best:g}, seed {seed0})",
            "",
            "| variant | held-out success, final | mean over evals after step 0 | env-token CE, start → end |"
            + (" samples to GRPO's seed-0 peak |" if reach else ""),
            "|---|---|---|---|" + ("---|" if reach else ""),
        ]
        for norm, d in norms.items():
            c = curve(d)
            name = arm_label(best, norm, exp.decay_steps).removeprefix("ECHO ")
            lines.append(
                f"| {name} | {c[-1]['eval/success']:.3f} | {auc(d):.3f} | {ce(c, 0)} → {ce(c, -1)} |" + to_target(d)
            )
    if by == "reach":
        why = f"fewest samples to GRPO's seed-0 peak ({target0:.3f}), mean held-out success breaking ties"
    else:
        why = "best mean held-out success over the run in the sweep"
    why = why if best in sweep else "no sweep run finished yet"
    lines += ["", f"Chosen: {arm_label(best, arm, exp.decay_steps)} ({why}).", ""]
    grpo = runs.get(0.0, [])
    if not grpo:
        return lines
    target = max(v for _, v in mean_curve(grpo, "eval/success"))
    lines += [
        "## Seeds (mean ± std over seeds [± half-width of the 95% t-interval of the mean])",
        "",
        f"GRPO's best held-out success: {target:.3f}, the peak of GRPO's mean curve over its seeds. Samples to reach",
        "it: the first evaluation at or above it, per seed (`>N`: never within the run, counted as N, one evaluation",
        "interval past the end).",
        "",
        "| arm | seeds | held-out success, final | peak | mean over evals | env-token CE start | env-token CE end "
        "| policy entropy, peak | samples to GRPO's best |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reach: dict[float, list[float]] = {}
    for coeff, dirs in sorted(runs.items()):
        curves = [curve(d) for d in dirs]
        hits = [reach_or_censored(d, target) for d in dirs]
        reach[coeff] = [s for s, _ in hits]
        cells = ", ".join(f">{s:.0f}" if cens else f"{s:.0f}" for s, cens in hits)
        lines.append(
            f"| {arm_label(coeff, arm if coeff else DEFAULT_NORM, exp.decay_steps)} | {len(dirs)} "
            f"| {ms([c[-1]['eval/success'] for c in curves])} "
            f"| {ms([max(r['eval/success'] for r in c) for c in curves])} | {ms([auc(d) for d in dirs])} "
            f"| {ms([c[0].get('eval/echo_ce', float('nan')) for c in curves])} "
            f"| {ms([c[-1].get('eval/echo_ce', float('nan')) for c in curves])} "
            f"| {ms([peak_entropy(d) for d in dirs])} | {cells} |"
        )
    echo = [c for c in runs if c != 0.0]
    if echo and len(reach[0.0]) and len(reach[echo[0]]):
        r, lo, hi = ratio_ci(reach[echo[0]], reach[0.0])
        lines += [
            "",
            f"Samples GRPO + {arm_label(echo[0], arm, exp.decay_steps)} needs to reach GRPO's best, over GRPO's: "
            f"**{r:.2f}** "
            f"(95% bootstrap interval over seeds {lo:.2f}–{hi:.2f}; {len(reach[echo[0]])} and {len(reach[0.0])} "
            "seeds; ≤ 0.5 is the ECHO paper's ~2x).",
        ]
    lines += [
        "",
        "Mean held-out success curves (over seeds):",
        "",
        "| samples | " + " | ".join(arm_label(c, arm, exp.decay_steps) for c in sorted(runs)) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    means = {c: mean_curve(d, "eval/success") for c, d in sorted(runs.items())}
    for i in range(min(len(m) for m in means.values())):
        lines.append(f"| {means[0.0][i][0]} | " + " | ".join(f"{means[c][i][1]:.3f}" for c in sorted(runs)) + " |")
    return lines


def plot(runs: dict[float, list[Path]], out: Path, arm: str = DEFAULT_NORM, decay_steps: int = 0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (coeff, dirs), color in zip(sorted(runs.items()), ["tab:blue", "tab:orange", "tab:green", "tab:red"]):
        label = "GRPO" if coeff == 0 else "GRPO + " + arm_label(coeff, arm, decay_steps)
        for key, ax in (("eval/success", axes[0]), ("eval/echo_ce", axes[1])):
            for d in dirs:
                c = curve(d)
                ax.plot([r["samples"] for r in c], [r.get(key, float("nan")) for r in c], color=color, alpha=0.25)
            mean = mean_curve(dirs, key)
            ax.plot([x for x, _ in mean], [y for _, y in mean], "o-", color=color, label=f"{label} ({len(dirs)})")
    axes[0].set_ylabel("held-out success")
    axes[1].set_ylabel("held-out environment-token CE (nats)")
    for ax in axes:
        ax.set_xlabel("trajectories sampled")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def report(exp: Experiment, runs, sweep, norms, best: float, arm: str = DEFAULT_NORM, by: str = "auc") -> None:
    doc = ROOT / "docs" / "echo.md"
    doc.parent.mkdir(exist_ok=True)
    text = doc.read_text() if doc.exists() else ""
    body = tables(exp, runs, sweep, norms, best, arm, by)
    if exp.task == "calculator":
        head = [
            "# ECHO on the default calculator task",
            "",
            "GRPO (λ = 0) against GRPO + ECHO (λ·CE on the calculator's output tokens), everything else the README's",
            "default run. Reproduce: `python benchmarks/run.py echo` (then `--report-only` to redraw).",
            "",
            *body,
            "",
            "![held-out success and env-token CE vs samples](echo.png)",
            "",
        ]
        # The hand-written reading after ANALYSIS (and any other task's section in it) survives a regeneration.
        doc.write_text("\n".join(head) + "\n" + ANALYSIS + (text.partition(ANALYSIS)[2] or "\n"))
        plot(runs, ROOT / "docs" / "echo.png")
    else:
        begin, end = f"<!-- echo:{exp.task} -->", f"<!-- /echo:{exp.task} -->"
        cmd = f"python benchmarks/run.py echo --config {exp.config.relative_to(ROOT)}"
        cmd += f" --name {exp.task}" if exp.task != task_name(exp.config) else ""
        tail = f" -- {' '.join(exp.extra)}" if exp.extra else ""
        section = [
            begin,
            f"## Generated: GRPO vs GRPO + ECHO on `{exp.config.relative_to(ROOT)}`{tail.replace(' --', ',')}",
            "",
            f"Reproduce: `{cmd} ...{tail}` (the arguments above each table's runs); `{cmd} --report-only{tail}` "
            "redraws.",
            "",
            *[line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in body],
            "",
            f"![held-out success and env-token CE vs samples, {exp.task}](echo-{exp.task}.png)",
            end,
        ]
        before, found, rest = text.partition(begin)
        after = rest.partition(end)[2] if found else ""
        doc.write_text(before.rstrip("\n") + "\n\n" + "\n".join(section) + (after or "\n"))
        plot(runs, ROOT / "docs" / f"echo-{exp.task}.png", arm, exp.decay_steps)
    print(doc.read_text())


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CALCULATOR, help="the task's training config (an example's)")
    p.add_argument("--sweep", type=float, nargs="+", default=[0.005, 0.05, 0.2])
    p.add_argument("--normalizations", nargs="*", default=[], help=f"{NORM_KEY} values to try at the best λ")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--pick", choices=("auc", "reach"), default="auc", help="how the seed-0 runs choose the ECHO arm")
    p.add_argument("--schedule", choices=SCHEDULES, help="also try λ decaying to 0 at the picked λ (seed 0)")
    p.add_argument("--decay-steps", type=int, default=40, help="steps of the --schedule decay")
    p.add_argument("--name", help="the experiment's name (runs/echo-<name>/, its docs section), default the config's")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args(argv)
    exp = Experiment(args.config, args.overrides, args.decay_steps, args.name)
    done = lambda d: (d / "summary.json").exists()  # noqa: E731
    if args.report_only:
        run = lambda c, s, n=DEFAULT_NORM: exp.run_dir(c, s, n)  # noqa: E731
    else:
        run = exp.train
    first = args.seeds[0]
    sweep = {0.0: run(0.0, first)} | {c: run(c, first) for c in args.sweep}
    sweep = {c: d for c, d in sweep.items() if done(d)}
    target0 = max(r["eval/success"] for r in curve(sweep[0.0])) if 0.0 in sweep else 1.0
    echo = {c: d for c, d in sweep.items() if c != 0.0}
    best = pick(echo, target0, args.pick) if echo else args.sweep[0]
    variants = [*args.normalizations, *([args.schedule] if args.schedule else [])]
    norms = {n: run(best, first, n) for n in variants}
    norms = {n: d for n, d in norms.items() if done(d)}
    arm = pick({DEFAULT_NORM: sweep[best]} | norms, target0, args.pick) if best in sweep else DEFAULT_NORM
    # Seed by seed, GRPO then ECHO: an experiment cut short still compares the arms on the same seeds.
    pairs = [(c, s) for s in args.seeds for c in (0.0, best)]
    dirs = [(c, run(c, s, arm if c else DEFAULT_NORM)) for c, s in pairs]
    runs = {c: [d for c2, d in dirs if c2 == c and done(d)] for c in (0.0, best)}
    runs = {c: ds for c, ds in runs.items() if ds}  # --report-only on an unfinished experiment
    report(exp, runs, sweep, norms, best, arm, args.pick)
