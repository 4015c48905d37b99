"""GRPO vs GRPO + ECHO on the default calculator task: held-out success vs samples, held-out environment-token CE.

    python benchmarks/echo_experiment.py                        # sweep lambda (seed 0), then 3 seeds of GRPO and
                                                                # of the best lambda; ~25 min on 2 CPU cores
    python benchmarks/echo_experiment.py --report-only          # rebuild docs/echo.md from the runs on disk
    python benchmarks/echo_experiment.py --sweep 0.01 0.1 --seeds 0 1 2 3 -- run.steps=80   # other settings

Each run is `agentrl-ray train examples/calculator/config.yaml echo.coeff=L run.seed=S` (the
README's default run, nothing else changed), in its own Ray instance, one after another. Held-out success and
held-out environment-token CE come from the run's own evaluations (`eval/success`, `eval/env_token_ce` in
metrics.jsonl, every `run.eval_every` steps on the same held-out prompts). The lambda for the seeded comparison is
the sweep value with the best mean held-out success over the run's evaluations after step 0 (area under the curve),
so a lambda that gets there sooner wins over one that only ends level.

Writes runs/echo/<name>/ for each run, docs/echo.md (table) and docs/echo.png (curves, mean and per seed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/calculator/config.yaml"
OUT = ROOT / "runs" / "echo"
ANALYSIS = "<!-- analysis: kept when the tables are regenerated -->"


def run_name(coeff: float, seed: int) -> str:
    return f"lam{coeff:g}-seed{seed}"


def train(coeff: float, seed: int, extra: list[str]) -> Path:
    run_dir = OUT / run_name(coeff, seed)
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
        str(CONFIG),
        f"echo.coeff={coeff}",
        f"run.seed={seed}",
        f"run.output_dir={OUT}",
        f"run.name={run_dir.name}",
        "run.checkpoint_every=0",
        "run.keep_checkpoints=1",
        *extra,
    ]
    print(f"[echo] {run_dir.name}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return run_dir


def curve(run_dir: Path) -> list[dict]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in records if "eval/success" in r]


def auc(run_dir: Path) -> float:
    return statistics.mean(r["eval/success"] for r in curve(run_dir) if r["step"] > 0)


def samples_to_reach(run_dir: Path, target: float) -> int | None:
    for r in curve(run_dir):
        if r["eval/success"] >= target:
            return r["samples"]
    return None


def report(runs: dict[float, list[Path]], sweep: dict[float, Path], best: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grpo = runs[0.0]
    grpo_best = statistics.mean(max(r["eval/success"] for r in curve(d)) for d in grpo)
    rows = []
    for coeff, dirs in sorted(runs.items()):
        curves = [curve(d) for d in dirs]
        final = [c[-1]["eval/success"] for c in curves]
        peak = [max(r["eval/success"] for r in c) for c in curves]
        ce_start = [c[0].get("eval/env_token_ce", float("nan")) for c in curves]
        ce_end = [c[-1].get("eval/env_token_ce", float("nan")) for c in curves]
        reach = [samples_to_reach(d, grpo_best) for d in dirs]
        reach80 = [samples_to_reach(d, 0.8) for d in dirs]
        rows.append((coeff, len(dirs), final, peak, [auc(d) for d in dirs], ce_start, ce_end, reach, reach80))

    def ms(xs: list[float]) -> str:
        return f"{statistics.mean(xs):.3f} ± {statistics.pstdev(xs):.3f}"

    lines = [
        "# ECHO on the default calculator task",
        "",
        "GRPO (λ = 0) against GRPO + ECHO (λ·CE on the calculator's output tokens), everything else the README's",
        "default run. Reproduce: `python benchmarks/echo_experiment.py` (then `--report-only` to redraw).",
        "",
        "## λ sweep (seed 0)",
        "",
        "| λ | held-out success, final | mean over evals after step 0 | held-out env-token CE, start → end |",
        "|---|---|---|---|",
    ]
    for coeff, d in sorted(sweep.items()):
        c = curve(d)
        lines.append(
            f"| {coeff:g} | {c[-1]['eval/success']:.3f} | {auc(d):.3f} | "
            f"{c[0].get('eval/env_token_ce', float('nan')):.2f} → {c[-1].get('eval/env_token_ce', float('nan')):.2f} |"
        )
    lines += [
        "",
        f"Chosen λ = {best:g} (best mean held-out success over the run).",
        "",
        "## Seeds (mean ± std over seeds)",
        "",
        f"Samples to reach GRPO's best held-out success ({grpo_best:.3f}, mean over GRPO seeds of each seed's peak):",
        "the first evaluation at or above it, per seed (– = never within the run).",
        "",
        "| λ | seeds | held-out success, final | peak | mean over evals | env-token CE start | env-token CE end "
        "| samples to GRPO's best | samples to 0.8 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for coeff, n, final, peak, aucs, ce0, ce1, reach, reach80 in rows:
        reach_s, reach80_s = (", ".join("–" if r is None else str(r) for r in xs) for xs in (reach, reach80))
        lines.append(
            f"| {coeff:g} | {n} | {ms(final)} | {ms(peak)} | {ms(aucs)} | {ms(ce0)} | {ms(ce1)} | {reach_s} "
            f"| {reach80_s} |"
        )
    lines += ["", "![held-out success and env-token CE vs samples](echo.png)", ""]
    doc = ROOT / "docs" / "echo.md"
    doc.parent.mkdir(exist_ok=True)
    # The hand-written reading of the results after ANALYSIS survives a regeneration of the tables.
    kept = doc.read_text().partition(ANALYSIS)[2] if doc.exists() else ""
    doc.write_text("\n".join(lines) + "\n" + ANALYSIS + (kept or "\n"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (coeff, dirs), color in zip(sorted(runs.items()), ["tab:blue", "tab:orange", "tab:green", "tab:red"]):
        label = "GRPO" if coeff == 0 else f"GRPO + ECHO λ={coeff:g}"
        curves = [curve(d) for d in dirs]
        xs = [r["samples"] for r in curves[0]]
        for key, ax in (("eval/success", axes[0]), ("eval/env_token_ce", axes[1])):
            for c in curves:
                ax.plot([r["samples"] for r in c], [r.get(key, float("nan")) for r in c], color=color, alpha=0.25)
            n = min(len(c) for c in curves)
            mean = [statistics.mean(c[i].get(key, float("nan")) for c in curves) for i in range(n)]
            ax.plot(xs[:n], mean, "o-", color=color, label=label)
    axes[0].set_ylabel("held-out success")
    axes[1].set_ylabel("held-out environment-token CE (nats)")
    for ax in axes:
        ax.set_xlabel("trajectories sampled")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "echo.png", dpi=110)
    print((ROOT / "docs" / "echo.md").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", type=float, nargs="+", default=[0.005, 0.05, 0.2])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--report-only", action="store_true")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    run = (lambda c, s: OUT / run_name(c, s)) if args.report_only else (lambda c, s: train(c, s, args.overrides))
    sweep = {c: run(c, args.seeds[0]) for c in args.sweep}
    best = max(args.sweep, key=lambda c: auc(sweep[c]))
    runs = {0.0: [run(0.0, s) for s in args.seeds], best: [run(best, s) for s in args.seeds]}
    report(runs, sweep, best)


if __name__ == "__main__":
    main()
