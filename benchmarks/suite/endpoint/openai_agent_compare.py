"""The calculator trained two ways with the same seed and steps: the built-in environment and the same task as an
OpenAI-client program behind the endpoint (examples/openai_agent). Reads both runs' metrics.jsonl, prints the
held-out success and training reward curves, writes benchmarks/results/openai_agent_compare/<date>-<machine>.json
(or --out) and docs/openai_agent.png.

    agentrl-ray train examples/calculator/config.yaml run.steps=30 run.name=cmp_builtin
    agentrl-ray train examples/openai_agent/config.yaml run.steps=30 run.name=cmp_agent
    python benchmarks/run.py endpoint --mode openai_agent_compare runs/cmp_builtin runs/cmp_agent
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from results_path import ROOT, default_out, with_meta


def curves(run_dir: Path) -> dict:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = {r["step"]: r["eval/success"] for r in records if "eval/success" in r}
    train = {r["step"]: r["reward/mean"] for r in records if "reward/mean" in r}
    step_s = [r["time/step_s"] for r in records if "time/step_s" in r]
    return {"eval_success": evals, "train_reward": train, "mean_step_s": sum(step_s) / max(1, len(step_s))}


def compare(builtin: Path, agent: Path, out: Path) -> None:
    result = {"builtin": curves(builtin), "agent": curves(agent)}
    steps = sorted(set(result["builtin"]["eval_success"]) | set(result["agent"]["eval_success"]))
    print("| step | " + " | ".join(str(s) for s in steps) + " |")
    for name in ("builtin", "agent"):
        row = [result[name]["eval_success"].get(s) for s in steps]
        print(f"| {name} | " + " | ".join("" if v is None else f"{v:.3f}" for v in row) + " |")
    out.parent.mkdir(parents=True, exist_ok=True)
    last = {name: max(result[name]["eval_success"].items(), default=(None, None)) for name in ("builtin", "agent")}
    summary = "held-out success at the last evaluation: " + ", ".join(
        f"{name} {v:.3f} (step {s})" if s is not None else f"{name} none" for name, (s, v) in last.items()
    )
    out.write_text(json.dumps(with_meta(result, summary), indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, label in (("builtin", "built-in CalculatorEnv"), ("agent", "OpenAI-client program (env.agent)")):
        ev, tr = result[name]["eval_success"], result[name]["train_reward"]
        axes[0].plot(list(ev), list(ev.values()), marker="o", label=label)
        axes[1].plot(list(tr), list(tr.values()), label=label)
    axes[0].set(title="held-out success (greedy, 200 questions)", xlabel="step")
    axes[1].set(title="training reward (mean)", xlabel="step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "openai_agent.png", dpi=110)


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builtin", type=Path, help="the built-in environment's run folder")
    p.add_argument("agent", type=Path, help="the OpenAI-client program's run folder")
    p.add_argument("--out", type=Path, help="JSON result (default: benchmarks/results/openai_agent_compare/)")
    a = p.parse_args(argv)
    compare(a.builtin, a.agent, a.out or default_out("openai_agent_compare"))
