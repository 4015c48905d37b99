"""The expected balance of a plan: how long a step's rollout and update take on the planned engines and learner ranks,
which side waits for the other in each pipeline, from the per-phase costs a measured run recorded.

    agentrl-ray train examples/longtail/config.yaml run.steps=6 run.eval_at_start=false run.name=probe
    agentrl-ray plan examples/longtail/config.yaml sync.pipeline=stream --nodes '[{"count": 8, "CPU": 32}]' \
        --measured runs/probe

The model, first order and written down so that its misses can be read (docs/async.md checks it against measured
runs): from the measured run's steps after the first (medians), an engine spends `rollout_worker_s / (S0 / E0)`
seconds per sample (the slowest worker's call over its share of the S0 samples of a step on E0 engines; its
generating part alone `generate_s / (S0 / E0)`), and a learner rank `learner_s / (S0 / L0)` (data parallel, linear).
The planned step's S samples on E engines and L ranks then take, per step:

- batch, k=0: rollout + update + sync (each waits for the other);
- batch, k=1: max(rollout, update) + sync (step t+1 is sampled while step t trains);
- stream, k>=1: at best max(generating, update) + sync: an episode waits for its own tool only, so the engines'
  waiting on the environment's tail overlaps other episodes' generation; the groups dropped as stale cost more.

Not modelled: a batched call's cost is not linear in its batch (more engines with fewer samples each are slower per
sample than this says), and engines and learner that share cores slow each other down (docs/async.md measured the
update 1.5x slower beside generation on 2 cores).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from agentrl_ray.config import Config, ConfigError

KEYS = ("time/rollout_worker_s", "time/generate_s", "time/learner_s", "time/sync_s")


@dataclass(frozen=True)
class Costs:
    """Seconds per sample on one engine (its whole rollout call, and the generating part of it) and on one learner
    rank, and a sync's seconds: what one measured run says."""

    engine_s: float
    generate_s: float
    learner_s: float
    sync_s: float
    source: str


def measured_costs(run_dir: Path) -> Costs:
    """The per-sample costs of a finished batch-pipeline run (its config.json, placement.json and metrics.jsonl)."""
    run_dir = Path(run_dir)
    missing = [n for n in ("config.json", "placement.json", "metrics.jsonl") if not (run_dir / n).is_file()]
    if missing:
        raise ConfigError(
            f"--measured {run_dir}: no {', '.join(missing)} there: name the folder of a run of a few steps "
            "(agentrl-ray train CONFIG run.steps=6 run.eval_at_start=false)"
        )
    cfg = json.loads((run_dir / "config.json").read_text())
    if cfg["sync"]["pipeline"] != "batch":
        raise ConfigError(
            f"--measured {run_dir}: a stream run's engine calls overlap, so they do not give an engine's cost per "
            "sample: measure with sync.pipeline=batch"
        )
    placement = json.loads((run_dir / "placement.json").read_text())
    engines, ranks = len(placement["engines"]), len(placement["learners"])
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "time/step_s" in r]
    steps = [r for r in steps[1:] if all(k in r for k in KEYS)]  # the first step holds the start-up
    if not steps:
        raise ConfigError(f"--measured {run_dir}: no step after the first recorded its times: run at least 3 steps")
    median = {k: statistics.median(r[k] for r in steps) for k in KEYS}
    samples = cfg["rollout"]["prompts_per_step"] * cfg["rollout"]["group_size"]
    per_engine, per_rank = samples / engines, samples / ranks
    return Costs(
        engine_s=median["time/rollout_worker_s"] / per_engine,
        generate_s=median["time/generate_s"] / per_engine,
        learner_s=median["time/learner_s"] / per_rank,
        sync_s=median["time/sync_s"],
        source=f"{run_dir}: {engines} engine(s), {ranks} learner rank(s), {samples} samples a step, "
        f"{len(steps)} steps after the first",
    )


def expected_balance(costs: Costs, cfg: Config, engines: int, ranks: int) -> dict[str, float]:
    """Seconds per step of each side and of each pipeline, for `cfg`'s samples a step on `engines` and `ranks`."""
    samples = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    rollout = costs.engine_s * samples / engines
    generating = costs.generate_s * samples / engines
    update = costs.learner_s * samples / ranks
    return {
        "samples": samples,
        "rollout_s": rollout,
        "generating_s": generating,
        "update_s": update,
        "sync_s": costs.sync_s,
        "batch_k0_s": rollout + update + costs.sync_s,
        "batch_k1_s": max(rollout, update) + costs.sync_s,
        "stream_s": max(generating, update) + costs.sync_s,
    }


def describe(costs: Costs, cfg: Config, engines: int, ranks: int) -> str:
    b = expected_balance(costs, cfg, engines, ranks)
    n = b["samples"]
    this = {"batch": "batch, k=0" if cfg.sync.max_staleness == 0 else "batch, k=1", "stream": "stream"}[
        cfg.sync.pipeline
    ]
    lines = [
        f"expected balance (costs from {costs.source}):",
        f"  a step of {n} samples: rollout {b['rollout_s']:.2f} s on {engines} engine(s) (generating "
        f"{b['generating_s']:.2f} s of it), update {b['update_s']:.2f} s on {ranks} learner rank(s), sync "
        f"{b['sync_s']:.3f} s",
    ]
    for name, key in (("batch, k=0", "batch_k0_s"), ("batch, k=1", "batch_k1_s"), ("stream", "stream_s")):
        at_best = "at best " if name == "stream" else ""
        mark = "   <- this config" if name == this else ""
        lines.append(f"  {name:11s} {at_best}~{b[key]:.2f} s a step, ~{n / b[key]:.0f} samples/s{mark}")
    engine_side = b["generating_s"] if cfg.sync.pipeline == "stream" else b["rollout_s"]
    if engine_side > b["update_s"]:
        idle = 1 - b["update_s"] / engine_side
        lines.append(
            f"  the engines are the bottleneck: overlapped, the learner idles ~{idle:.0%} of a step; more engines "
            "speed it up, more learner ranks do not"
        )
    else:
        idle = 1 - engine_side / b["update_s"]
        lines.append(
            f"  the learner is the bottleneck: overlapped, the engines idle ~{idle:.0%} of a step; more learner "
            "ranks (or fewer engines) balance it"
        )
    return "\n".join(lines)
