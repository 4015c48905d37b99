"""Scale through env actors: hundreds of environment instances on a few EnvHost actors, one tool call each.

    .venv/bin/python benchmarks/run.py environments                  # 512 instances on 4 actors, both envs (< 1 min)
    .venv/bin/python benchmarks/run.py environments --instances 32 --out /tmp/env_scale.json        # quick check
    RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . \
        -- python benchmarks/run.py environments --out /tmp/env_scale.json                       # on a Ray cluster

CPU only: a GPU machine runs the same command and uses no GPU. Without RAY_ADDRESS it starts its own local Ray (it
never joins a cluster already running on the machine); under `ray job submit` it joins the job's cluster, where
the actors may land on any node (the JSON is then written on the node that runs the entrypoint).

For each env (the calculator, and CodeExecutionEnv with the real sandbox) it creates every instance (keys spread
over the actors by crc32, as RolloutWorker does), fires one tool call per instance at once (calculator: an
arithmetic expression; code exec: a small Python program), waits for all, then closes every instance. Latency is
measured on the driver, from submitting a call to holding its result: it includes Ray, queueing in the actor and the
tool itself. A call fails when its observation is an error or not the expected output (expected: 0 failures).
Results are printed as a table and written as JSON to benchmarks/results/env_scale/<date>-<machine>.json (or --out;
see docs/sandbox.md).

Timeouts: an EnvHost runs at most `max_threads` (32) sync tools at once and queues the rest, and its tool timeout
counts that queueing. With 512 code-exec calls on 4 actors, 128 sandboxes run at a time and the last calls wait
several seconds on 2 cores: the default `env.tool_timeout_s=10` could kill them, so `--tool-timeout` defaults to
60 s here. The sandbox's own wall-clock limit (`--sandbox-wall-s`) starts only when its process does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from results_path import ROOT, default_out, with_meta

sys.path.insert(0, str(ROOT))

from agentrl_ray.chat_format import ToolCall  # noqa: E402


@dataclass
class Workload:
    """One env under test: how to build an instance and what each instance's call and answer are."""

    name: str
    env_path: str
    env_kwargs: dict

    def row(self, i: int) -> dict:
        return {"id": i, "tests": ""} if self.name == "code_exec" else {"id": i}

    def call(self, i: int) -> ToolCall:
        if self.name == "code_exec":
            return ToolCall("run_python", {"code": f"n = {i}\nprint(sum(k * k for k in range(n)))"})
        return ToolCall("calculator", {"expression": f"({i} * 7 + 3) - 1"})

    def expected(self, i: int) -> str:
        return str(sum(k * k for k in range(i))) if self.name == "code_exec" else str(i * 7 + 2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed_calls(refs: Iterator) -> tuple[list[float], list, float]:
    """Submit every call (`refs` yields them as they are sent), wait for all; returns each call's latency from its
    own submission to its result (stamped by a callback when Ray resolves it), the results and the wall time."""
    t0 = time.perf_counter()
    futures, submitted, finished = [], [], {}
    for ref in refs:
        submitted.append(time.perf_counter())
        future = ref.future()
        future.add_done_callback(lambda f, i=len(futures): finished.setdefault(i, time.perf_counter()))
        futures.append(future)
    results = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    return [finished[i] - s for i, s in enumerate(submitted)], results, wall


def run_workload(w: Workload, hosts: list, n: int, sequential: int) -> dict:
    import ray

    keys = [f"{w.name}-{i}" for i in range(n)]
    owner = [hosts[zlib.crc32(k.encode()) % len(hosts)] for k in keys]  # RolloutWorker's placement
    before = ray.get([h.stats.remote() for h in hosts])

    create_lat, _, create_wall = timed_calls(
        h.create.remote(k, w.env_path, w.env_kwargs, w.row(i)) for i, (k, h) in enumerate(zip(keys, owner))
    )
    call_lat, results, call_wall = timed_calls(
        h.call_tools.remote(k, [w.call(i)], []) for i, (k, h) in enumerate(zip(keys, owner))
    )
    after = ray.get([h.stats.remote() for h in hosts])
    # An idle round trip: the same kind of call, one at a time (for code exec: the sandbox start plus Ray).
    seq, seq_failed = [], 0
    for i in range(sequential):
        t0 = time.perf_counter()
        (r,) = ray.get(owner[0].call_tools.remote(keys[0], [w.call(i)], []))
        seq.append(time.perf_counter() - t0)
        seq_failed += r.error or r.text != w.expected(i)
    close_lat, closed, close_wall = timed_calls(h.close.remote(k) for k, h in zip(keys, owner))

    failed = [(i, r[0].text) for i, r in enumerate(results) if r[0].error or r[0].text != w.expected(i)]
    per_actor = [sum(o == h for o in owner) for h in hosts]
    host_delta = {k: sum(a[k] - b[k] for a, b in zip(after, before)) for k in ("calls", "errors", "timeouts")}
    return {
        "instances": n,
        "actors": len(hosts),
        "instances_per_actor": [min(per_actor), max(per_actor)],
        "wall_s": create_wall + call_wall + close_wall,
        "calls_wall_s": call_wall,
        "calls_per_s": n / call_wall,
        "p50_ms": 1000 * percentile(call_lat, 0.5),
        "p90_ms": 1000 * percentile(call_lat, 0.9),
        "p99_ms": 1000 * percentile(call_lat, 0.99),
        "max_ms": 1000 * max(call_lat),
        "create_wall_s": create_wall,
        "create_p50_ms": 1000 * percentile(create_lat, 0.5),
        "close_wall_s": close_wall,
        "close_p50_ms": 1000 * percentile(close_lat, 0.5),
        "closed": sum(closed),
        "failed": len(failed),
        "first_failure": None if not failed else {"instance": failed[0][0], "observation": failed[0][1][:500]},
        "host_counters": host_delta,  # cross-check of the concurrent calls, as the actors counted them
        "sequential_call_ms": 1000 * statistics.median(seq),
        "sequential_failed": seq_failed,
    }


def sandbox_start_ms(runs: int, wall_s: float) -> float:
    """Median of sequential `run_python("pass")` in this process: what one sandbox costs before any code runs."""
    from agentrl_ray.envs.isolation.sandbox import SandboxLimits, run_python

    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = run_python("pass", limits=SandboxLimits(wall_time_s=wall_s))
        times.append(time.perf_counter() - t0)
        if result.exit_code != 0:
            raise RuntimeError(f"the sandbox cannot run `pass` here: {result.observation()}")
    return 1000 * statistics.median(times)


def start_ray(actors: int, cpus_per_actor: float) -> None:
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        # Logical CPUs only: the actors' reservations must fit, whatever the machine has.
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, math.ceil(actors * cpus_per_actor)),
            include_dashboard=False,
        )


def print_table(envs: dict[str, dict]) -> None:
    columns = [
        ("env", "{}"),
        ("instances", "{}"),
        ("actors", "{}"),
        ("wall_s", "{:.2f}"),
        ("calls_per_s", "{:.0f}"),
        ("p50_ms", "{:.0f}"),
        ("p90_ms", "{:.0f}"),
        ("p99_ms", "{:.0f}"),
        ("create_wall_s", "{:.2f}"),
        ("close_wall_s", "{:.2f}"),
        ("failed", "{}"),
        ("sandbox_start_ms", "{:.1f}"),
    ]
    rows = [
        [fmt.format(v) if (v := {"env": name, **m}.get(col)) is not None else "-" for col, fmt in columns]
        for name, m in envs.items()
    ]
    widths = [max(len(col), *(len(r[j]) for r in rows)) for j, (col, _) in enumerate(columns)]
    print("  ".join(col.rjust(w) for (col, _), w in zip(columns, widths)))
    for r in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(r, widths)))


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=512, help="environment instances (and calls) per env")
    parser.add_argument("--actors", type=int, default=4, help="EnvHost actors")
    parser.add_argument("--cpus-per-actor", type=float, default=0.25, help="Ray CPUs each actor reserves (env config)")
    parser.add_argument("--max-threads", type=int, default=32, help="EnvHost's sync-tool threads per actor")
    parser.add_argument("--tool-timeout", type=float, default=60.0, help="EnvHost tool_timeout_s (queueing counts)")
    parser.add_argument("--sandbox-wall-s", type=float, default=20.0, help="code exec: sandbox wall-clock limit")
    parser.add_argument("--sequential", type=int, default=10, help="one-at-a-time runs for the start costs")
    parser.add_argument("--envs", default="calculator,code_exec", help="comma-separated subset")
    parser.add_argument("--out", default=None, help="JSON report (default: benchmarks/results/env_scale/)")
    args = parser.parse_args(argv)

    import ray

    from agentrl_ray.envs.host import EnvHost
    from agentrl_ray.envs.isolation.sandbox import network_isolation_available

    workloads = {
        "calculator": Workload("calculator", "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {}),
        "code_exec": Workload(
            "code_exec", "agentrl_ray.envs.builtin.code_exec:CodeExecutionEnv", {"wall_time_s": args.sandbox_wall_s}
        ),
    }
    chosen = [workloads[name] for name in args.envs.split(",")]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg()[0],
        "root": os.geteuid() == 0,
        "network_isolated": network_isolation_available(),
        "args": vars(args),
        "envs": {},
    }
    start_ray(args.actors, args.cpus_per_actor)
    try:
        actor = ray.remote(EnvHost).options(num_cpus=args.cpus_per_actor, max_concurrency=1000)  # as RolloutPool
        hosts = [
            actor.remote(tool_timeout_s=args.tool_timeout, max_threads=args.max_threads) for _ in range(args.actors)
        ]
        ray.get([h.stats.remote() for h in hosts])  # every actor is up before a clock starts
        for w in chosen:
            m = run_workload(w, hosts, args.instances, args.sequential)
            if w.name == "code_exec":
                m["sandbox_start_ms"] = sandbox_start_ms(args.sequential, args.sandbox_wall_s)
            report["envs"][w.name] = m
    finally:
        ray.shutdown()
    report["load_avg_at_end"] = os.getloadavg()[0]
    print_table(report["envs"])
    out = Path(args.out) if args.out else default_out("env_scale")
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = f"{args.instances} instances on {args.actors} actors, one call each: " + ", ".join(
        f"{name} p50 {m['p50_ms']:.0f} ms, p99 {m['p99_ms']:.0f} ms, {m['failed']} failed"
        for name, m in report["envs"].items()
    )
    out.write_text(json.dumps(with_meta(report, summary), indent=2) + "\n")
    print(f"wrote {out}")
    failures = {
        name: m["first_failure"] or "a sequential call"
        for name, m in report["envs"].items()
        if m["failed"] or m["sequential_failed"]
    }
    if failures:
        print(f"FAILED calls (expected none): {json.dumps(failures, indent=2)}", file=sys.stderr)
        sys.exit(1)
