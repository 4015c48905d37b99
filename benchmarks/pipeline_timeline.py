"""Where a step's time goes on the long-tail agent workload, in the pipeline's modes: the baseline every change to the
pipeline (issue 67, docs/async.md) is measured against.

    python benchmarks/pipeline_timeline.py                 # examples/longtail, 12 steps, sync.max_staleness 0 and 1
    python benchmarks/pipeline_timeline.py --steps 20 -- env.kwargs.sigma=1.5

Each mode is one run of the installed CLI (`agentrl-ray train CONFIG sync.max_staleness=K`), no evaluation; the
first step (start-up's) is left out. Per step, from metrics.jsonl (medians over the steps, and sums):
- step: wall time; trajectories/s;
- learner: busy (`time/learner_s`: the update), waiting for rollouts (`time/rollout_s`), sync (`time/sync_s`);
- engines (the slowest worker's rollout call, `time/rollout_worker_s`): generating (`time/generate_s`), waiting on
  the environment (`time/env_s`: the turn's slowest episode holds the others' next turn), the rest of the call
  (loading weights, rewards), and idle between calls (the step's wall minus the call, where positive).
The environment's latency is log-normal (median_s, sigma from the config): its p99/median is printed with it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from cli_runs import commit, train_records, write_result
from results_path import cpu_tag

KEYS = {
    "step_s": "time/step_s",
    "learner_busy_s": "time/learner_s",
    "learner_waiting_s": "time/rollout_s",
    "sync_s": "time/sync_s",
    "engine_call_s": "time/rollout_worker_s",
    "engine_generating_s": "time/generate_s",
    "engine_waiting_on_env_s": "time/env_s",
}


def summarize(records: list[dict], trajectories_per_step: int) -> dict:
    steps = [r for r in records if r.get("step", 0) >= 2]
    out: dict = {"steps": len(steps)}
    for name, key in KEYS.items():
        values = [r.get(key, 0.0) for r in steps]
        out[name] = {"median": statistics.median(values), "sum": sum(values)}
    idle = [max(0.0, r["time/step_s"] - r.get("time/rollout_worker_s", 0.0)) for r in steps]
    out["engine_idle_s"] = {"median": statistics.median(idle), "sum": sum(idle)}
    out["trajectories_per_s"] = trajectories_per_step * len(steps) / out["step_s"]["sum"]
    out["reward_mean"] = statistics.fmean(r.get("reward/mean", 0.0) for r in steps)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="examples/longtail/config.yaml")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--staleness", default="0,1", help="the sync.max_staleness values to run, in order")
    p.add_argument("--out", default=None)
    p.add_argument("extra", nargs="*", help="config overrides for every run")
    a = p.parse_args()
    from agentrl_ray.envs.builtin.longtail import p99_over_median
    from agentrl_ray.infra.profiles import load_config

    cfg = load_config(a.config, a.extra)
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    base = [f"run.steps={a.steps}", "run.eval_at_start=false", "run.eval_every=0", "run.checkpoint_every=0", *a.extra]
    t0 = time.time()
    modes = {}
    for k in a.staleness.split(","):
        records = train_records(a.config, [*base, f"sync.max_staleness={k}"])
        modes[f"max_staleness={k}"] = summarize(records, per_step)
    sigma = cfg.env.kwargs.get("sigma")
    result = {
        "command": " ".join(["python benchmarks/pipeline_timeline.py", *sys.argv[1:]]),
        "commit": commit(),
        "machine": cpu_tag(),
        "config": a.config,
        "env_latency": {"median_s": cfg.env.kwargs.get("median_s"), "sigma": sigma}
        | ({"p99_over_median": p99_over_median(sigma)} if sigma is not None else {}),
        "trajectories_per_step": per_step,
        "modes": modes,
        "wall_s": time.time() - t0,
    }
    print(f"{'per step (median, s)':28s}" + "".join(f"{m:>18s}" for m in modes))
    for name in [*KEYS, "engine_idle_s"]:
        print(f"{name:28s}" + "".join(f"{v[name]['median']:18.3f}" for v in modes.values()))
    print(f"{'trajectories/s':28s}" + "".join(f"{v['trajectories_per_s']:18.2f}" for v in modes.values()))
    write_result("pipeline_timeline", a.config, a.out, result)


if __name__ == "__main__":
    main()
