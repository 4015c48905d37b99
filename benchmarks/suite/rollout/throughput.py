"""Throughput of a training run: samples/s, sampled tokens/s and the per-phase split of a step.

    python benchmarks/run.py rollout                          # runs the default config for 8 steps, then reports
    python benchmarks/run.py rollout --run-dir runs/calculator   # reports on an existing run's metrics.jsonl
    python benchmarks/run.py rollout --steps 12 -- rollout.group_size=4   # extra overrides after --
    python benchmarks/run.py rollout --name overlap -- sync.max_staleness=1

The first step is reported separately (engine warm-up); the rest are averaged. Results are printed and written to
benchmarks/results/throughput/<run name>-<date>-<machine>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from results_path import ROOT, default_out, with_meta

PHASES = ["generate_s", "env_s", "reward_s", "learner_s", "sync_s"]


def summarize(run_dir: Path) -> dict:
    """Means over the steps after the first, as throughput and as a per-actor profile of a step:
    - learner (rank 0): waiting for the rollout, forward/backward, optimizer, weight sync, the rest (logging,
      evaluation and checkpoints when they fall on a step);
    - rollout workers (the slowest one): generating, waiting on tools, scoring, idle.
    On-policy the two alternate and the learner's wait is the whole rollout; with `sync.max_staleness=1` the rollout
    of step t+1 runs during step t's update, and the learner waits only for what is not hidden."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "time/step_s" in r]
    if len(steps) < 2:
        raise SystemExit(f"{run_dir} has {len(steps)} training steps; need at least 2")
    warm = steps[1:]
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in warm)  # noqa: E731
    step_s = mean("time/step_s")
    samples = statistics.mean(r["samples"] - p["samples"] for p, r in zip(steps, steps[1:]))
    tokens = mean("rollout/sampled_tokens")
    out = {
        "run_dir": str(run_dir),
        "steps_measured": len(warm),
        "first_step_s": steps[0]["time/step_s"],
        "step_s": step_s,
        "step_s_stdev": statistics.pstdev(r["time/step_s"] for r in warm),
        "samples_per_s": samples / step_s,
        "sampled_tokens_per_s": tokens / step_s,
        "staleness": mean("rollout/staleness"),
        "phase_s": {p: mean(f"time/{p}") for p in PHASES},
    }
    learner = {
        "wait_for_rollout": mean("time/rollout_s"),
        "forward_backward": mean("time/learner_s") - mean("time/optimizer_s"),
        "optimizer": mean("time/optimizer_s"),
        "weight_sync": mean("time/sync_s"),
    }
    learner["other"] = max(0.0, step_s - sum(learner.values()))
    worker_s = mean("time/rollout_worker_s")
    rollout = {
        "load_weights": mean("time/load_weights_s"),
        "generate": mean("time/generate_s"),
        "wait_on_tools": mean("time/env_s"),
        "reward": mean("time/reward_s"),
    }
    rollout["other"] = max(0.0, worker_s - sum(rollout.values()))  # env creation/closing, batching, Ray calls
    rollout["idle"] = max(0.0, step_s - worker_s)
    out["profile_s"] = {"learner": learner, "rollout_worker": rollout}
    out["profile_fraction"] = {a: {k: v / step_s for k, v in ph.items()} for a, ph in out["profile_s"].items()}
    # Weight sync costs the learner its push; the engines' load delays the rollout, which is on the step's critical
    # path on-policy, and hidden behind the update when overlapped (unless the worker has no idle time left).
    hidden = out["staleness"] > 0 and rollout["idle"] > rollout["load_weights"]
    out["sync_fraction"] = (learner["weight_sync"] + (0.0 if hidden else rollout["load_weights"])) / step_s
    return out


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--config", default=str(ROOT / "examples/calculator/config.yaml"))
    p.add_argument("--name", default="throughput", help="run name (of a run this script starts)")
    p.add_argument("--out", type=Path, help="JSON result (default: benchmarks/results/throughput/<run name>-...)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    run_dir = args.run_dir
    if run_dir is None:
        out = ROOT / "runs" / "bench"
        cmd = [
            sys.executable,
            "-m",
            "agentrl_ray",
            "train",
            args.config,
            f"run.steps={args.steps}",
            f"run.name={args.name}",
            f"run.output_dir={out}",
            "run.eval_every=0",
            "run.eval_at_start=false",
            "run.checkpoint_every=0",
            *args.overrides,
        ]
        if (out / args.name).exists():
            import shutil

            shutil.rmtree(out / args.name)
        subprocess.run(cmd, check=True)
        run_dir = out / args.name
    result = summarize(run_dir)
    print(f"samples/s        {result['samples_per_s']:.2f}")
    print(f"sampled tokens/s {result['sampled_tokens_per_s']:.1f}")
    print(
        f"step             {result['step_s']:.2f} s (± {result['step_s_stdev']:.2f}), first step "
        f"{result['first_step_s']:.2f} s"
    )
    sync = 100 * result["sync_fraction"]
    print(f"staleness        {result['staleness']:.2f}   weight sync {sync:.1f}% of a step (critical path)")
    for actor, phases in result["profile_s"].items():
        print(f"  {actor}")
        for k, v in phases.items():
            print(f"    {k:<18} {v:7.3f} s  {100 * result['profile_fraction'][actor][k]:5.1f}%")
    dest = args.out or default_out("throughput", label=run_dir.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    summary = (
        f"{run_dir.name}: {result['samples_per_s']:.2f} samples/s, {result['sampled_tokens_per_s']:.1f} sampled "
        f"tokens/s, step {result['step_s']:.2f} s, weight sync {sync:.1f}% of a step"
    )
    dest.write_text(json.dumps(with_meta(result, summary), indent=2))
    print(f"wrote {dest}")
