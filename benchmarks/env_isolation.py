"""Per-trajectory cost of each `env.isolation` level: create (constructor + reset) and tool-call latency, p50/p99,
with 1 and 512 environments open at once on one EnvHost, and the memory they take.

    /work/wt/heavy python benchmarks/env_isolation.py [thread|process|sandbox ...]

Writes benchmarks/results/env_isolation/<date>-<machine>.json (or --out).

The environment is the built-in calculator (`CalculatorEnv`); all N creations are issued at once, then one
`calculator` call per environment at once, then all are closed. Latencies are per environment, queueing included
(512 at once on 2 cores is mostly queueing). Memory: the host process's peak RSS (ru_maxrss), and the proportional
set size (PSS: shared copy-on-write pages split among the sharers) of the zygote and its children while all N are
open. A warm-up environment is created first, so the zygote's one-time start (reported separately) is not in the
latencies. Results go to docs/reliability.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time
from pathlib import Path

from results_path import default_out

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.host import EnvHost

CALC = "agentrl_ray.envs.builtin.calculator:CalculatorEnv"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _pss_mb(root_pid: int) -> float:
    """PSS of `root_pid` and all its descendants, MB."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1024


async def measure(level: str, n: int) -> dict:
    host = EnvHost(tool_timeout_s=120.0, isolation=level, max_threads=32)
    t0 = time.perf_counter()
    await host.create("warm", CALC, {}, {})
    first = time.perf_counter() - t0
    await host.close("warm")

    async def timed(coro):
        t = time.perf_counter()
        out = await coro
        return time.perf_counter() - t, out

    keys = [f"k{i}" for i in range(n)]
    t0 = time.perf_counter()
    created = await asyncio.gather(*(timed(host.create(k, CALC, {}, {})) for k in keys))
    create_wall = time.perf_counter() - t0
    zygote = host._iso.children._zygote
    children_pss = _pss_mb(zygote.proc.pid) if zygote else 0.0
    calls = await asyncio.gather(
        *(timed(host.call_tools(k, [ToolCall("calculator", {"expression": "12 * 34"})], [])) for k in keys)
    )
    assert all(r[0].text == "408" for _, r in calls), calls[0]
    t0 = time.perf_counter()
    await asyncio.gather(*(host.close(k) for k in keys))
    close_wall = time.perf_counter() - t0
    stats = host.stats()
    assert stats["start_errors"] == 0 and stats["open"] == 0, stats
    c, k = [t for t, _ in created], [t for t, _ in calls]
    return {
        "level": level,
        "concurrent": n,
        "first_create_s": first,
        "create_p50_ms": 1e3 * statistics.median(c),
        "create_p99_ms": 1e3 * _pct(c, 0.99),
        "create_wall_s": create_wall,
        "call_p50_ms": 1e3 * statistics.median(k),
        "call_p99_ms": 1e3 * _pct(k, 0.99),
        "close_wall_s": close_wall,
        "zygote_and_children_pss_mb": children_pss,
        "host_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "levels",
        nargs="*",
        metavar="LEVEL",
        help="env.isolation levels: thread, process, sandbox (default: thread process, and sandbox as root)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON result (default: benchmarks/results/env_isolation/)")
    args = p.parse_args()
    levels = args.levels or ["thread", "process"] + (["sandbox"] if os.geteuid() == 0 else [])
    if set(levels) - {"thread", "process", "sandbox"}:
        p.error(f"unknown levels: {sorted(set(levels) - {'thread', 'process', 'sandbox'})}")
    out = args.out or default_out("env_isolation")
    rows = []
    for level in levels:
        for n in (1, 512):
            row = asyncio.run(measure(level, n))
            print(json.dumps(row), flush=True)
            rows.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_count": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
