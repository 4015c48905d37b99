"""`agentrl-ray eval CHECKPOINT`: held-out evaluation of a trained checkpoint on vLLM, with a transcript per row.

    agentrl-ray eval runs/calculator                     # the run's held-out set, its eval temperature and samples
    agentrl-ray eval runs/calculator/checkpoint_000010 --samples 8 --temperature 1.0 --data held_out.jsonl

It samples through `inference.Agent` (the run's rollout worker, agent loop, environment and reward functions) and
reports pass@1 with a 95% bootstrap interval over prompts (and per category, for rows with a `category` column),
pass@k (the unbiased estimator of Chen et al. 2021,
https://arxiv.org/abs/2107.03374), the tool error rate and turns per conversation; `transcripts.jsonl` holds
every conversation as OpenAI-style messages. With the defaults (the run's eval set, `rollout.eval_temperature`,
`run.eval_samples` and seed -1 - step, the seed the learner's evaluation used at that step) it reproduces the
`eval/success` that the run logged for the checkpoint's step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl_ray.rewards.eval_stats import by_category, pass_rates

if TYPE_CHECKING:
    from agentrl_ray.types import TrajectoryGroup


def summarize(groups: list[TrajectoryGroup], threshold: float) -> dict[str, Any]:
    """The report of one evaluation: pass@1 (+ interval) and pass@k (`eval_stats.pass_rates`, as training's
    evaluations report them), mean reward, tool error rate (failed / all tool calls), tool calls and assistant turns
    per sample."""
    trajs = [t for g in groups for t in g.trajectories]
    report = pass_rates(groups, threshold)
    calls = sum(t.num_tool_calls for t in trajs)
    report.update(
        reward=sum(t.reward for t in trajs) / len(trajs),
        tool_error_rate=sum(t.num_tool_errors for t in trajs) / max(1, calls),
        tool_calls_per_sample=calls / len(trajs),
        turns_per_sample=sum(sum(m["role"] == "assistant" for m in t.completion_messages) for t in trajs) / len(trajs),
        finish_reasons={r: sum(t.finish_reason == r for t in trajs) for r in sorted({t.finish_reason for t in trajs})},
    )
    return report


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    data: str | None = None,
    size: int | None = None,
    samples: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate; writes `report.json` and `transcripts.jsonl` to `out` (default: `eval_<step>/` beside the
    checkpoint) and returns the report."""
    from agentrl_ray.data import load_rows
    from agentrl_ray.trained.inference import Agent, transcript

    with Agent.load(checkpoint) as agent:
        cfg, ckpt = agent.cfg, agent.checkpoint
        rows = load_rows(data or cfg.data.eval, cfg.data, split="eval", size=size or cfg.data.eval_size)
        samples = samples or cfg.run.eval_samples
        temperature = cfg.rollout.eval_temperature if temperature is None else temperature
        seed = -1 - ckpt.step if seed is None else seed
        groups = agent.sample(rows, samples, temperature, seed)
    report = summarize(groups, cfg.run.success_threshold)
    categories = by_category(groups, rows, cfg.run.success_threshold)
    if categories:  # rows with a category column (BFCL): each category's pass@1 with its own interval
        report["by_category"] = categories
    report.update(checkpoint=str(ckpt.path), step=ckpt.step, temperature=temperature, seed=seed)
    out = Path(out) if out else ckpt.run_dir / f"eval_{ckpt.step:06d}"
    out.mkdir(parents=True, exist_ok=True)
    by_id = {str(r["id"]): r for r in rows}
    with (out / "transcripts.jsonl").open("w") as f:
        for g in groups:
            for t in g.trajectories:
                f.write(json.dumps(transcript(by_id[g.prompt_id], t, cfg)) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2))
    report["out"] = str(out)
    return report


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint_NNNNNN folder, or a run folder (its newest checkpoint)")
    p.add_argument("--data", help="a .jsonl file or dataset folder (default: the run's data.eval)")
    p.add_argument("--size", type=int, help="rows to evaluate (default: the run's data.eval_size)")
    p.add_argument("--samples", type=int, help="samples per row (default: the run's run.eval_samples)")
    p.add_argument("--temperature", type=float, help="default: the run's rollout.eval_temperature")
    p.add_argument("--seed", type=int, help="default: -1 - step, the seed of the run's own evaluation at that step")
    p.add_argument("--out", help="output folder (default: RUN/eval_<step>/)")


def main(args) -> int:
    report = evaluate_checkpoint(
        args.checkpoint,
        data=args.data,
        size=args.size,
        samples=args.samples,
        temperature=args.temperature,
        seed=args.seed,
        out=args.out,
    )
    lo, hi = report["pass@1_ci95"]
    passes = " ".join(f"{k} {v:.3f}" for k, v in report.items() if k.startswith("pass@") and not k.endswith("ci95"))
    print(
        f"{report['prompts']} prompts x {report['samples_per_prompt']} samples: {passes} (pass@1 95% CI "
        f"{lo:.3f}-{hi:.3f}) | tool error rate {report['tool_error_rate']:.3f} | turns "
        f"{report['turns_per_sample']:.2f} | transcripts: {report['out']}/transcripts.jsonl"
    )
    for name, r in report.get("by_category", {}).items():
        lo, hi = r["pass@1_ci95"]
        print(f"  {name}: {r['prompts']} prompts, pass@1 {r['pass@1']:.3f} (95% CI {lo:.3f}-{hi:.3f})")
    return 0
