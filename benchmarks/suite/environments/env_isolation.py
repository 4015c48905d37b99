"""Per-trajectory cost of each `env.isolation` level: create (constructor + reset) and tool-call latency, p50/p99,
with 1 and 512 environments open at once on one EnvHost, and the memory they take.

    python benchmarks/run.py environments --mode env_isolation [thread|process|sandbox ...]

Writes benchmarks/results/env_isolation/<date>-<machine>.json (or --out).

    python benchmarks/run.py environments --mode env_isolation --adapters [--games 64]

`--adapters`: instead, the cost an environment library's adapter adds, on one task (guess a number in 1..10 by
binary search): per game, create + reset, then each turn-based step, through one EnvHost at `thread` isolation,
for a plain class of ours, OpenEnv's `Environment` in process and served (create_fastapi_app under uvicorn on
loopback, OpenEnv's GenericEnvClient), GEM's GuessTheNumber and TextArena's (their own games: the same task, their
own rules). Writes benchmarks/results/env_isolation/adapters-<date>-<machine>.json.

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

from results_path import ROOT, default_out, with_meta

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


class OurGuess:
    """The task as a turn-based environment of ours: guess a number in 1..10, "higher" / "lower" until right."""

    def reset(self, **row) -> str:
        import random

        self.target = random.Random(row["seed"]).randint(1, 10)
        return "Guess a number in 1..10: reply with the number only."

    def step(self, text: str) -> tuple[str | None, float, bool]:
        guess = int(text) if text.strip().isdigit() else None
        if guess == self.target:
            return None, 1.0, True
        return ("higher" if (guess or 0) < self.target else "lower"), 0.0, False


def _serve_openenv_guess() -> tuple[str, object]:
    """tests/unit/openenv_envs.py's GuessEnv (written against OpenEnv's API) served on a loopback port."""
    import socket
    import sys
    import threading

    import httpx
    import uvicorn

    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import openenv_envs
    from openenv.core.env_server.http_server import create_fastapi_app

    app = create_fastapi_app(openenv_envs.GuessEnv, openenv_envs.GuessAction, openenv_envs.GuessObservation)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return url, server


async def measure_adapter(name: str, path: str, kwargs: dict, games: int, high: int) -> dict:
    host = EnvHost(tool_timeout_s=120.0, isolation="thread", max_threads=32)
    await host.create("warm", path, kwargs, {"id": "warm", "seed": 0, "prompt": "Play."})
    await host.close("warm")
    creates, steps, turns, rewards = [], [], [], []
    for g in range(games):  # one game at a time: the adapter's cost, not the host's queueing
        key = f"g{g}"
        t = time.perf_counter()
        await host.create(key, path, kwargs, {"id": key, "seed": g, "prompt": "Play."})
        creates.append(time.perf_counter() - t)
        lo, hi, reward, n = 1, high, 0.0, 0
        while n < 16:
            guess = (lo + hi) // 2
            text = {"gem": f"\\boxed{{{guess}}}", "textarena": f"[{guess}]"}.get(name, str(guess))
            t = time.perf_counter()
            result = await host.call_turn(key, text)
            steps.append(time.perf_counter() - t)
            n += 1
            reward += result.reward
            if result.done:
                break
            hint = result.observation if isinstance(result.observation, str) else str(result.observation)
            lo, hi = (guess + 1, hi) if "higher" in hint else (lo, guess - 1)
        turns.append(n)
        rewards.append(reward)
        await host.close(key)
    return {
        "adapter": name,
        "games": games,
        "create_p50_ms": 1e3 * statistics.median(creates),
        "step_p50_ms": 1e3 * statistics.median(steps),
        "step_p99_ms": 1e3 * _pct(steps, 0.99),
        "turns_mean": statistics.mean(turns),
        "reward_mean": statistics.mean(rewards),
    }


def adapters(games: int) -> list[dict]:
    url, server = _serve_openenv_guess()  # also puts tests/unit (openenv_envs) on the path
    cases = [
        ("ours", "suite.environments.env_isolation:OurGuess", {}, 10),
        ("openenv", "openenv_envs:GuessEnv", {}, 10),
        ("openenv_served", "agentrl_ray.envs.adapters.openenv:OpenEnvServer", {"url": url}, 10),
        ("gem", "agentrl_ray.envs.adapters.gem:GEMEnv", {"id": "game:GuessTheNumber-v0-easy"}, 10),
        ("textarena", "agentrl_ray.envs.adapters.textarena:TextArenaEnv", {"id": "GuessTheNumber-v0"}, 20),
    ]
    try:
        return [asyncio.run(measure_adapter(name, path, kw, games, high)) for name, path, kw, high in cases]
    finally:
        server.should_exit = True


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "levels",
        nargs="*",
        metavar="LEVEL",
        help="env.isolation levels: thread, process, sandbox (default: thread process, and sandbox as root)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON result (default: benchmarks/results/env_isolation/)")
    p.add_argument("--adapters", action="store_true", help="the per-step cost of the environment libraries' adapters")
    p.add_argument("--games", type=int, default=64, help="--adapters: games per adapter, one at a time")
    args = p.parse_args(argv)
    if args.adapters:
        rows = adapters(args.games)
        for row in rows:
            print(json.dumps(row), flush=True)
        out = args.out or default_out("env_isolation", label="adapters")
        out.parent.mkdir(parents=True, exist_ok=True)
        summary = "step p50: " + ", ".join(f"{r['adapter']} {r['step_p50_ms']:.2f} ms" for r in rows)
        out.write_text(json.dumps(with_meta({"cpu_count": os.cpu_count(), "rows": rows}, summary), indent=1) + "\n")
        print(f"wrote {out}")
        return
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
    summary = "call p50/p99: " + ", ".join(
        f"{r['level']} x{r['concurrent']} {r['call_p50_ms']:.1f}/{r['call_p99_ms']:.1f} ms" for r in rows
    )
    out.write_text(json.dumps(with_meta({"cpu_count": os.cpu_count(), "rows": rows}, summary), indent=1) + "\n")
    print(f"wrote {out}")
