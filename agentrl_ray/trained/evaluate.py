"""`agentrl-ray eval CHECKPOINT`: held-out evaluation of a trained checkpoint on vLLM, with a transcript per row.

    agentrl-ray eval runs/calculator                     # the run's held-out set, its eval temperature and samples
    agentrl-ray eval runs/calculator/checkpoint_000010 --samples 8 --temperature 1.0 --data held_out.jsonl
    agentrl-ray eval --config examples/bfcl/config.yaml [key=value ...]   # the config's model.path, untrained

It samples through `inference.Agent` (the run's rollout worker, agent loop, environment and reward functions) and
reports pass@1 with a 95% bootstrap interval over prompts (and per category, for rows with a `category` column),
pass@k (the unbiased estimator of Chen et al. 2021,
https://arxiv.org/abs/2107.03374), the tool error rate and turns per conversation; `transcripts.jsonl` holds
every conversation as OpenAI-style messages. With the defaults (the run's eval set, `rollout.eval_temperature`,
`run.eval_samples` and seed -1 - step, the seed the learner's evaluation used at that step) it reproduces the
`eval/success` that the run logged for the checkpoint's step.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl_ray.rewards.eval_stats import by_category, pass_rates

if TYPE_CHECKING:
    from agentrl_ray.config import Config
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
    config: Config | None = None,
) -> dict[str, Any]:
    """Evaluate `checkpoint`, or with `config` (and no checkpoint) the model its `model.path` names before any
    training (step 0: the untrained or warm-started model); writes `report.json` and `transcripts.jsonl` to `out`
    (default: `eval_<step>/` beside the checkpoint, `<run dir>/eval_model/` for a config) and returns the report."""
    from agentrl_ray.data import load_rows
    from agentrl_ray.trained.inference import Agent, transcript

    if config is not None:
        from agentrl_ray.builtin.resolve import resolve_model

        agent, step = Agent(config, resolve_model(config.model.path)), 0
        out = out or config.run_dir / "eval_model"
    else:
        agent = Agent.load(checkpoint)
        step = agent.checkpoint.step
        out = out or agent.checkpoint.run_dir / f"eval_{step:06d}"
    with agent:
        cfg = agent.cfg
        rows = load_rows(data or cfg.data.eval, cfg.data, split="eval", size=size or cfg.data.eval_size)
        samples = samples or cfg.run.eval_samples
        temperature = cfg.rollout.eval_temperature if temperature is None else temperature
        seed = -1 - step if seed is None else seed
        groups = agent.sample(rows, samples, temperature, seed)
    report = summarize(groups, cfg.run.success_threshold)
    categories = by_category(groups, rows, cfg.run.success_threshold)
    if categories:  # rows with a category column (BFCL): each category's pass@1 with its own interval
        report["by_category"] = categories
    checkpoint_path = str(agent.checkpoint.path) if agent.checkpoint else None
    report.update(checkpoint=checkpoint_path, model=cfg.model.path, step=step, temperature=temperature, seed=seed)
    out = Path(out)
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
    p.add_argument(
        "checkpoint",
        nargs="*",
        help="a checkpoint_NNNNNN folder, or a run folder (its newest checkpoint); with --config: key=value overrides",
    )
    p.add_argument("--config", help="evaluate this config's model.path as it is, before training (the untrained model)")
    p.add_argument("--data", help="a .jsonl file or dataset folder (default: the run's data.eval)")
    p.add_argument("--size", type=int, help="rows to evaluate (default: the run's data.eval_size)")
    p.add_argument("--samples", type=int, help="samples per row (default: the run's run.eval_samples)")
    p.add_argument("--temperature", type=float, help="default: the run's rollout.eval_temperature")
    p.add_argument("--seed", type=int, help="default: -1 - step, the seed of the run's own evaluation at that step")
    p.add_argument("--out", help="output folder (default: RUN/eval_<step>/)")
    p.add_argument("-v", "--verbose", action="store_true", help="show Ray's, vLLM's and torch's output here")


def main(args) -> int:
    from agentrl_ray.config import ConfigError
    from agentrl_ray.infra import console

    config = None
    if args.config:
        from agentrl_ray.infra.profiles import load_config

        config = load_config(args.config, args.checkpoint)
    elif len(args.checkpoint) != 1:
        raise ConfigError("give one checkpoint (or a run folder), or --config CONFIG.yaml [key=value ...]")
    if args.out:
        log = Path(args.out) / "log.txt"
    elif config is not None:
        log = config.run_dir / "eval_model" / "log.txt"
    else:
        from agentrl_ray.trained.checkpoints import find_checkpoint

        log = find_checkpoint(args.checkpoint[0]).run_dir / "eval_log.txt"  # a bad path: one line, nothing started
    with contextlib.nullcontext() if args.verbose else console.quiet(log, "Ray, vLLM and torch"):
        report = evaluate_checkpoint(
            None if config else args.checkpoint[0],
            config=config,
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
