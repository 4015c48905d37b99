"""Where a step's time goes on the long-tail agent workload, in the pipeline's modes: the baseline every change to the
pipeline (issue 67, docs/async.md) is measured against.

    python benchmarks/run.py rollout --mode pipeline_timeline         # examples/longtail, 12 steps: k=0, 1; stream 2, 4
    python benchmarks/run.py rollout --mode pipeline_timeline --modes 0,stream:2 --steps 20 -- env.kwargs.sigma=1.5
    python benchmarks/run.py rollout --mode pipeline_timeline --cluster          # on a multi-node Ray cluster
    python benchmarks/run.py rollout --mode pipeline_timeline --cluster --pin-cores   # each node its own cores
    python benchmarks/run.py rollout --mode pipeline_timeline --modes 0,stream:4 --steps 30 --heldout-seeds 0 1 2

With `--cluster` every run joins one `ray.cluster_utils.Cluster` started here: a head without CPUs, a rollout node
(the engines and env hosts, pinned by custom resources) and a learner node, each its own raylet and object store, so
weights and trajectories cross nodes as on a real cluster. On one machine the nodes still share its cores.

Each mode is one run of the installed CLI (`agentrl-ray train CONFIG sync.max_staleness=K`, with
`sync.pipeline=stream` for `stream:K`), no evaluation; the first step (start-up's) is left out. Per step, from
metrics.jsonl (medians over the steps, and sums):
- step: wall time; trajectories/s;
- learner: busy (`time/learner_s`: the update), waiting for rollouts (`time/rollout_s`), sync (`time/sync_s`);
- engines (the slowest worker's rollout call, `time/rollout_worker_s`): generating (`time/generate_s`), waiting on
  the environment (`time/env_s`: the turn's slowest episode holds the others' next turn), the rest of the call
  (loading weights, rewards), and idle between calls (the step's wall minus the call, where positive).
The environment's latency is log-normal (median_s, sigma from the config): its p99/median is printed with it.
In the stream pipeline the engine's columns are per group call (many run at once, their turns batched together), so
its busy/idle split is not one call's; throughput counts trained trajectories (`samples`), and the groups dropped as
stale or sampled again after a lost call are reported beside it. `speedup_vs_sync` and `speedup_vs_one_step_off`
compare each mode's trained trajectories/s with batch k=0's and k=1's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

from results_path import default_out
from suite.common.cli_runs import train_records, write_result

KEYS = {
    "step_s": "time/step_s",
    "learner_busy_s": "time/learner_s",
    "learner_waiting_s": "time/rollout_s",
    "sync_s": "time/sync_s",
    "engine_call_s": "time/rollout_worker_s",
    "engine_generating_s": "time/generate_s",
    "engine_waiting_on_env_s": "time/env_s",
}


def summarize(records: list[dict]) -> dict:
    steps = [r for r in records if r.get("step", 0) >= 2]
    first = next(r for r in records if r.get("step") == 1)
    out: dict = {"steps": len(steps)}
    for name, key in KEYS.items():
        values = [r.get(key, 0.0) for r in steps]
        out[name] = {"median": statistics.median(values), "sum": sum(values)}
    idle = [max(0.0, r["time/step_s"] - r.get("time/rollout_worker_s", 0.0)) for r in steps]
    out["engine_idle_s"] = {"median": statistics.median(idle), "sum": sum(idle)}
    out["trajectories_per_s"] = (steps[-1]["samples"] - first["samples"]) / out["step_s"]["sum"]
    out["reward_mean"] = statistics.fmean(r.get("reward/mean", 0.0) for r in steps)
    for key in ("rollout/stale_dropped", "rollout/filtered_groups"):
        out[key.split("/")[1]] = sum(r.get(key, 0) for r in steps)
    out["regenerated_groups"] = steps[-1].get("rollout/regenerated_groups", 0)
    out["staleness_mean"] = statistics.fmean(r.get("rollout/staleness", 0.0) for r in steps)
    return out


# Engines and env hosts on the rollout node, the learner on its own (the custom resources of `multi_node_cluster`).
PINNED = [
    "rollout.resources={rollout_node: 1}",
    "env.resources={rollout_node: 1}",
    "learner.resources={learner_node: 1}",
]


@contextlib.contextmanager
def multi_node_cluster(cpus_per_node: int, pin_cores: bool = False):
    """A Ray cluster of three nodes on this machine: a head without CPUs, a rollout node and a learner node. With
    `pin_cores` each of the two nodes gets cores of its own: its raylet, and so every worker it starts, is bound
    (CPU affinity) to half of the machine's cores, the rollout node the first half, as separate machines would be."""
    import psutil
    from ray.cluster_utils import Cluster

    cores = sorted(psutil.Process().cpu_affinity())
    halves = [cores[: len(cores) // 2], cores[len(cores) // 2 :]]
    if pin_cores and not all(halves):
        raise SystemExit(f"--pin-cores needs 2 cores or more; this process may use {cores}")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for role, half in zip(("rollout_node", "learner_node"), halves, strict=True):
            node = cluster.add_node(num_cpus=cpus_per_node, resources={role: 10})
            if pin_cores:
                (raylet,) = node.all_processes["raylet"]
                proc = psutil.Process(raylet.process.pid)
                for p in [proc, *proc.children(recursive=True)]:  # workers it started already, and itself
                    p.cpu_affinity(half)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def mode_overrides(mode: str) -> list[str]:
    """`K`: the batch pipeline at sync.max_staleness=K; `stream:K`: the stream pipeline."""
    if mode.startswith("stream:"):
        return ["sync.pipeline=stream", f"sync.max_staleness={mode.removeprefix('stream:')}"]
    return ["sync.pipeline=batch", f"sync.max_staleness={mode}"]


def heldout(a: argparse.Namespace) -> None:
    """Held-out success at the end of each mode's run, per seed: what streaming costs in learning, if anything. The
    result is written after every run (`done` false until the last), so a comparison cut short keeps its runs."""
    runs: dict[str, list[dict]] = {}
    t0 = time.time()
    label = f"{Path(a.config).parent.name}-heldout"
    out = a.out or str(default_out("pipeline_timeline", label=label))
    total = len(a.heldout_seeds) * len(a.modes.split(","))
    for seed in a.heldout_seeds:
        for mode in a.modes.split(","):
            base = [f"run.steps={a.steps}", "run.eval_at_start=false", f"run.eval_every={a.steps}"]
            base += ["run.checkpoint_every=0", f"run.seed={seed}", *a.extra]
            records = train_records(a.config, [*base, *mode_overrides(mode)])
            last = [r for r in records if "eval/success" in r][-1]
            ci = [last.get("eval/pass@1_ci95_lo"), last.get("eval/pass@1_ci95_hi")]
            runs.setdefault(mode, []).append({"seed": seed, "success": last["eval/success"], "ci95": ci})
            print(f"seed {seed} mode {mode}: held-out success {last['eval/success']:.3f} (95% CI {ci})", flush=True)
            done = sum(map(len, runs.values())) == total
            write_result("pipeline_timeline", a.config, out, *_heldout_result(a, runs, done, time.time() - t0))


def _heldout_result(a: argparse.Namespace, runs: dict[str, list[dict]], done: bool, wall_s: float) -> tuple:
    """The result of the runs so far, each marked within the sync run's 95% interval of its seed where there is one,
    and its summary."""
    sync = {r["seed"]: r for r in runs.get("0", [])}
    for rows in runs.values():
        for r in rows:
            if r["seed"] in sync:
                lo, hi = sync[r["seed"]]["ci95"]
                r["within_sync_ci95"] = lo is not None and lo <= r["success"] <= hi
    modes = {
        mode: {"runs": rows, "mean_success": statistics.fmean(r["success"] for r in rows)}
        for mode, rows in runs.items()
    }
    summary = ", ".join(f"{m} {v['mean_success']:.3f}" for m, v in modes.items())
    result = {"config": a.config, "steps": a.steps, "seeds": a.heldout_seeds, "done": done, "heldout": modes}
    return {**result, "wall_s": wall_s}, f"held-out success at step {a.steps}, mean over seeds so far: {summary}"


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="examples/longtail/config.yaml")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--modes", default="0,1,stream:2,stream:4", help="K (batch pipeline) or stream:K, in order")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--project",
        action="store_true",
        help="then calibrate the pipeline simulator here, check it against these modes and project to 64 engines and "
        "8 learner ranks (pipeline_sim; needs the modes 0, 1, stream:2 and stream:4)",
    )
    p.add_argument("extra", nargs="*", help="config overrides for every run")
    p.add_argument(
        "--project-from",
        default=None,
        help="--project against this earlier result, measuring nothing (its stored calibration too: see --calibrate)",
    )
    p.add_argument("--calibrate", action="store_true", help="with --project-from: measure the calibration again")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="run every mode on a multi-node ray.cluster_utils.Cluster started here: the engines and env hosts on "
        "one node, the learner on another",
    )
    p.add_argument("--node-cpus", type=int, default=2, help="--cluster: logical CPUs of each of the two nodes")
    p.add_argument(
        "--pin-cores",
        action="store_true",
        help="--cluster: bind the rollout node to the first half of the cores and the learner node to the second "
        "(CPU affinity), so that engines and learner do not compete for cores, as on separate machines",
    )
    p.add_argument(
        "--heldout-seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="SEED",
        help="instead of timing: train each mode --steps steps once per seed and compare the held-out success at the "
        "end (the config's eval split, greedy) with the synchronous run's 95%% interval of the same seed",
    )
    a = p.parse_args(argv)
    if a.heldout_seeds:
        heldout(a)
        return
    if a.project_from:
        from suite.rollout.pipeline_sim import project

        path = Path(a.project_from)
        result = json.loads(path.read_text())
        stored = None if a.calibrate else result.get("projection", {}).get("calibration")
        result["projection"] = project(result["config"], path, a.steps, stored)
        path.write_text(json.dumps(result, indent=1) + "\n")
        return
    from agentrl_ray.envs.builtin.longtail import p99_over_median
    from agentrl_ray.infra.profiles import load_config

    cfg = load_config(a.config, a.extra)
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    names = {"0": "sync", "1": "one_step_off"}
    base = [f"run.steps={a.steps}", "run.eval_at_start=false", "run.eval_every=0", "run.checkpoint_every=0", *a.extra]
    t0 = time.time()
    modes = {}
    with multi_node_cluster(a.node_cpus, a.pin_cores) if a.cluster else contextlib.nullcontext() as address:
        for mode in a.modes.split(","):
            records = train_records(a.config, [*base, *(PINNED if a.cluster else []), *mode_overrides(mode)], address)
            modes[names.get(mode, mode.replace(":", "_k"))] = summarize(records)
    for mode in modes.values():
        for ref in ("sync", "one_step_off"):
            if ref in modes:
                mode[f"speedup_vs_{ref}"] = mode["trajectories_per_s"] / modes[ref]["trajectories_per_s"]
    sigma = cfg.env.kwargs.get("sigma")
    result = {
        "config": a.config,
        "env_latency": {"median_s": cfg.env.kwargs.get("median_s"), "sigma": sigma}
        | ({"p99_over_median": p99_over_median(sigma)} if sigma is not None else {}),
        "trajectories_per_step": per_step,
        "ray": f"multi-node Cluster: head (0 CPUs), rollout node and learner node ({a.node_cpus} CPUs each"
        + (", each bound to half of the cores)" if a.pin_cores else ")")
        if a.cluster
        else "local",
        "modes": modes,
        "wall_s": time.time() - t0,
    }
    print(f"{'per step (median, s)':28s}" + "".join(f"{m:>18s}" for m in modes))
    for name in [*KEYS, "engine_idle_s"]:
        print(f"{name:28s}" + "".join(f"{v[name]['median']:18.3f}" for v in modes.values()))
    for name in ("trajectories_per_s", "speedup_vs_sync", "speedup_vs_one_step_off", "staleness_mean"):
        print(f"{name:28s}" + "".join(f"{v.get(name, float('nan')):18.2f}" for v in modes.values()))
    for name in ("stale_dropped", "regenerated_groups"):
        print(f"{name:28s}" + "".join(f"{v[name]:18d}" for v in modes.values()))
    summary = ", ".join(f"{name} {m['trajectories_per_s']:.2f} trajectories/s" for name, m in modes.items())
    out = a.out
    if a.cluster and not out:  # beside the local Ray's result, not over it
        label = f"{Path(a.config).parent.name}-cluster" + ("-pinned" if a.pin_cores else "")
        out = str(default_out("pipeline_timeline", label=label))
    path = write_result("pipeline_timeline", a.config, out, result, summary)
    if a.project:
        from suite.rollout.pipeline_sim import project

        result = json.loads(path.read_text())  # with its meta
        result["projection"] = project(a.config, path, a.steps)
        path.write_text(json.dumps(result, indent=1) + "\n")
