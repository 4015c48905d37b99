"""Cost of a sandboxed run: start cost one at a time, and latency with hundreds of runs at once.

    python benchmarks/run.py environments --mode sandbox_latency                      # 512 concurrent runs of `pass`
    python benchmarks/run.py environments --mode sandbox_latency --concurrent 1024 --code "print(sum(range(10**6)))"

CPU only (no GPU involved). Start cost is the median time of `run_python("pass")` run one after another, next to
the same interpreter started bare (`python -I -c pass`), so the difference is what the sandbox adds; also as CPU
time (this process plus every process the run started), which other load on the machine barely changes. The
concurrent phase submits every run to a thread pool at once (one thread per run, as an env actor under load would)
and releases them together; a run's latency is from that release to its result (queueing for the 2 cores and
for the parent's GIL included). Prints latency percentiles, wall time and runs/s as JSON. Results: docs/sandbox.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from results_path import ROOT, with_meta

sys.path.insert(0, str(ROOT))

from agentrl_ray.envs.isolation.sandbox import SandboxLimits, run_python, sandbox_python  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_s() -> float:
    """CPU seconds of this process and of its reaped descendants (every process a run starts is reaped)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def start_cost(n: int) -> dict:
    python = sandbox_python()
    bare, sandboxed, bare_cpu, sandboxed_cpu = [], [], [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), cpu_s()
        subprocess.run([python, "-I", "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t0)
        bare_cpu.append(cpu_s() - c0)
        t0, c0 = time.perf_counter(), cpu_s()
        result = run_python("pass")
        sandboxed.append(time.perf_counter() - t0)
        sandboxed_cpu.append(cpu_s() - c0)
        assert result.exit_code == 0, result
    return {
        "python": python,
        "bare_ms": 1000 * statistics.median(bare),
        "bare_cpu_ms": 1000 * statistics.median(bare_cpu),
        "sandbox_cpu_ms": 1000 * statistics.median(sandboxed_cpu),
        "sandbox_ms": 1000 * statistics.median(sandboxed),
        "sandbox_p90_ms": 1000 * percentile(sandboxed, 0.9),
        "sandbox_p99_ms": 1000 * percentile(sandboxed, 0.99),
        "layers": {k: getattr(result, k) for k in ("uid_isolated", "namespaced", "cgroup_limited", "network_isolated")},
    }


def concurrent(n: int, code: str, limits: SandboxLimits) -> dict:
    # One thread and ~6 descriptors (pipes, pidfd, stdin file, uid lease) per run in flight.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16 * n + 1024)), hard))

    barrier = threading.Barrier(n + 1)  # every worker is up before the clock starts: all n runs start together

    def one(_: int) -> tuple[float, object]:
        barrier.wait()
        result = run_python(code, limits=limits)
        return time.perf_counter() - t0, result

    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        barrier.wait()
        t0 = time.perf_counter()
        runs = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    latencies = [t for t, _ in runs]
    failed = [r for _, r in runs if r.exit_code != 0]
    return {
        "runs": n,
        "wall_s": wall,
        "runs_per_s": n / wall,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "max_ms": 1000 * max(latencies),
        "failed": len(failed),
        "first_failure": failed[0].observation() if failed else None,
    }


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=512, help="runs in flight at once")
    parser.add_argument("--sequential", type=int, default=50, help="runs for the start cost")
    parser.add_argument("--code", default="pass", help="program each concurrent run executes")
    parser.add_argument("--wall-time-s", type=float, default=60.0, help="per-run wall limit (queueing counts)")
    args = parser.parse_args(argv)
    report = {"start": start_cost(args.sequential)}
    limits = SandboxLimits(wall_time_s=args.wall_time_s)
    report["concurrent"] = concurrent(args.concurrent, args.code, limits) | {"code": args.code}
    start, many = report["start"], report["concurrent"]
    summary = (
        f"start {start['sandbox_ms']:.1f} ms against a bare interpreter's {start['bare_ms']:.1f}; {many['runs']} at "
        f"once: p50 {many['p50_ms']:.0f} ms, p99 {many['p99_ms']:.0f} ms, {many['failed']} failed"
    )
    print(json.dumps(with_meta(report, summary), indent=2))
