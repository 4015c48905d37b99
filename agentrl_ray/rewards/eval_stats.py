"""Held-out evaluation statistics, shared by training's evaluations (`learner.metrics.evaluate`) and `agentrl-ray eval`.

pass@1 comes with a 95% percentile-bootstrap interval over prompts (the samples of one prompt are not independent,
so prompts are what is resampled); pass@k uses the unbiased estimator of Chen et al. 2021
(https://arxiv.org/abs/2107.03374), for k = 2, 4, ... up to the samples per prompt.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl_ray.types import TrajectoryGroup


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k of the n samples (c of them correct) passes, unbiased."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def bootstrap_interval(values: list[float], *, level: float = 0.95, rounds: int = 2000, seed: int = 0):
    """Percentile bootstrap interval of the mean of `values` (one per prompt: samples of a prompt are not
    independent, so prompts are what is resampled). Sorted first: the interval depends on the values, not on the
    order the prompts' groups came back in."""
    rng = random.Random(seed)
    values = sorted(values)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(rounds))
    lo = means[int((1 - level) / 2 * rounds)]
    hi = means[min(rounds - 1, int((1 + level) / 2 * rounds))]
    return lo, hi


def pass_rates(groups: list[TrajectoryGroup], threshold: float) -> dict[str, Any]:
    """Success over all samples, pass@1 with its 95% bootstrap interval, and pass@k for k = 2, 4, ... up to the
    fewest samples any prompt has."""
    trajs = [t for g in groups for t in g.trajectories]
    n = min(len(g.trajectories) for g in groups)
    correct = [sum(t.reward >= threshold for t in g.trajectories) for g in groups]
    per_prompt = [c / len(g.trajectories) for c, g in zip(correct, groups)]
    lo, hi = bootstrap_interval(per_prompt)
    out: dict[str, Any] = {
        "prompts": len(groups),
        "samples_per_prompt": n,
        "success": sum(t.reward >= threshold for t in trajs) / len(trajs),
        "pass@1": sum(per_prompt) / len(per_prompt),
        "pass@1_ci95": [lo, hi],
    }
    k = 2
    while k <= n:
        out[f"pass@{k}"] = sum(pass_at_k(len(g.trajectories), c, k) for c, g in zip(correct, groups)) / len(groups)
        k *= 2
    return out


def by_category(groups: list[TrajectoryGroup], rows: list[dict[str, Any]], threshold: float) -> dict[str, dict]:
    """`pass_rates` per value of the rows' `category` column (BFCL's categories), each with its own interval; empty
    when the rows have no such column."""
    category = {str(r["id"]): str(r["category"]) for r in rows if r.get("category") is not None}
    if not category:
        return {}
    split: dict[str, list] = {}
    for g in groups:
        split.setdefault(category.get(g.prompt_id, "none"), []).append(g)
    return {c: pass_rates(split[c], threshold) for c in sorted(split)}


def training_eval_metrics(
    groups: list[TrajectoryGroup], threshold: float, rows: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """`pass_rates` as flat `eval/...` metrics of a training run's evaluation (metrics.jsonl, summary.json):
    eval/success, eval/pass@1, eval/pass@1_ci95_lo, eval/pass@1_ci95_hi, eval/pass@k (k >= 2, when
    `run.eval_samples` >= 2), eval/samples_per_prompt; with `rows` that have a `category` column, also
    eval/<category>/pass@1 and its interval for each category."""
    rates = pass_rates(groups, threshold)
    lo, hi = rates.pop("pass@1_ci95")
    rates.pop("prompts")
    out = {f"eval/{k}": float(v) for k, v in rates.items()} | {"eval/pass@1_ci95_lo": lo, "eval/pass@1_ci95_hi": hi}
    for name, r in by_category(groups, rows or [], threshold).items():
        lo, hi = r["pass@1_ci95"]
        out |= {
            f"eval/{name}/pass@1": r["pass@1"],
            f"eval/{name}/pass@1_ci95_lo": lo,
            f"eval/{name}/pass@1_ci95_hi": hi,
        }
    return out
