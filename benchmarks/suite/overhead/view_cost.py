"""What `agentrl-ray view` costs a training run: step time with no viewer, with the page open in a headless
Chromium (what a user does: it polls every 2 s and redraws), and with an API client polling 40x as often as the page
(20 Hz, a bound on the server's reads), one after the other on this machine. Writes
benchmarks/results/view_cost/<date>-<machine>.json (or --json).

    python benchmarks/run.py overhead --mode view_cost                         # default config, 20 steps per run
    python benchmarks/run.py overhead --mode view_cost --steps 30 --rounds 2   # modes interleaved, in the same order

Each mode is one `agentrl-ray train examples/calculator/config.yaml` run (a small held-out set, so that the run is
steps, not evaluation); the viewer serves the folder the runs write into, started before the run. Step time is
metrics.jsonl's `time/step_s` of every step but the first two (warm-up), median and mean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from results_path import ROOT, default_out, with_meta

MODES = ("none", "browser", "poll-20Hz")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_viewer(folder: Path, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "agentrl_ray", "view", str(folder), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.stdout.readline()
    for _ in range(100):
        if socket.socket().connect_ex(("127.0.0.1", port)) == 0:
            return proc
        time.sleep(0.1)
    raise RuntimeError("the viewer did not start")


def poller(url: str, run: str, stop: threading.Event, period: float) -> None:
    """What the page asks for, `period` apart: the run list, the whole metrics (since=0: the most work), the
    newest step's rollouts."""
    while not stop.is_set():
        for path in ("api/runs", f"api/metrics?run={run}&since=0", f"api/rollouts?run={run}"):
            try:
                urllib.request.urlopen(url + path, timeout=10).read()
            except OSError:
                pass  # the run folder appears a few seconds into the run
        stop.wait(period)


def browser(url: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.get(url)
    return driver


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (the viewer; Chromium's processes)."""
    import psutil

    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_mode(mode: str, out: Path, name: str, steps: int, extra: list[str]) -> tuple[list[float], list[float], dict]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    viewer = start_viewer(out, port) if mode != "none" else None
    stop, page = threading.Event(), None
    if mode == "browser":
        page = browser(url + f"?run={name}&tab=curves")
    if mode.startswith("poll"):
        threading.Thread(target=poller, args=(url, name, stop, 0.05), daemon=True).start()
    cmd = [sys.executable, "-m", "agentrl_ray", "train", "examples/calculator/config.yaml", f"run.output_dir={out}"]
    cmd += [f"run.name={name}", f"run.steps={steps}", "data.eval_size=20", "run.eval_every=5", *extra]
    cpu: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu["run_wall_s"] = time.monotonic() - t0
        if viewer is not None:  # the poller is a thread of this process: its CPU is not counted here
            cpu["viewer_cpu_s"] = cpu_seconds(viewer.pid)
        if page is not None:
            cpu["browser_cpu_s"] = cpu_seconds(page.service.process.pid)
    finally:
        stop.set()
        if page is not None:
            page.quit()
        if viewer is not None:
            viewer.terminate()
            viewer.wait()
    records = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step_s" in r and r["step"] > 2]
    # Wall time between two steps' records: the step and everything around it (logging, the rollout sample)
    # but not an evaluation (those steps are left out).
    wall = [b["time"] - a["time"] for a, b in zip(records, records[1:]) if b in steps and "eval/success" not in b]
    return [r["time/step_s"] for r in steps], wall, cpu


def sample_write_ms(run_dir: Path, repeat: int = 50) -> float:
    """Median milliseconds to write one step's rollout sample as the metrics actor does (json, fsync, rename)."""
    from agentrl_ray.run.outputs import write_rollouts

    src = sorted((run_dir / "rollouts").glob("step_*.jsonl"))[-1]
    records = [json.loads(x) for x in src.read_text().splitlines()]
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        write_rollouts(run_dir / "sample_bench", i, records)
        times.append(1000 * (time.perf_counter() - t0))
    shutil.rmtree(run_dir / "sample_bench")
    return statistics.median(times)


def server_cost(run_dir: Path, cycles: int = 300) -> dict[str, float]:
    """The viewer's own CPU per poll of the page (the run list, the new metrics records, the newest rollouts) on a
    copy of `run_dir`, with no training: CPU milliseconds per poll, as a share of one core at the page's rate."""
    folder = Path("/tmp/view_cost_server")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(run_dir, folder / run_dir.name, ignore=shutil.ignore_patterns("checkpoint_*", "wandb"))
    port = free_port()
    viewer = start_viewer(folder, port)
    url, name = f"http://127.0.0.1:{port}/", run_dir.name
    try:
        for path in ("api/runs", f"api/metrics?run={name}", f"api/rollouts?run={name}"):  # warm: imports, caches
            urllib.request.urlopen(url + path).read()
        cpu0, t0 = cpu_seconds(viewer.pid), time.perf_counter()
        for _ in range(cycles):
            for path in ("api/runs", f"api/metrics?run={name}&since=10000", f"api/rollouts?run={name}"):
                urllib.request.urlopen(url + path).read()
        cpu, wall = cpu_seconds(viewer.pid) - cpu0, time.perf_counter() - t0
    finally:
        viewer.terminate()
        viewer.wait()
    per_poll_ms = 1000 * cpu / cycles
    return {
        "cycles": cycles,
        "cpu_ms_per_poll": per_poll_ms,
        "wall_ms_per_poll": 1000 * wall / cycles,
        "core_share_at_page_rate": per_poll_ms / 1000 / (POLL_S),
    }


POLL_S = 2.0  # the page's poll period (static/app.js)


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default="/tmp/view_cost_runs", help="where the runs go (emptied first)")
    p.add_argument("--json", default=None, help="JSON result (default: benchmarks/results/view_cost/)")
    p.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    p.add_argument("--server-only", metavar="RUN_DIR", help="only the viewer's CPU per poll on a copy of RUN_DIR")
    args = p.parse_args(argv)
    if args.server_only:
        print(json.dumps(server_cost(Path(args.server_only)), indent=2))
        return
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            step, wall, cpu = run_mode(mode, out, f"cost-{mode}-{r}", args.steps, args.overrides)
            cpus[mode].append(cpu)
            times[mode] += step
            walls[mode] += wall
            print(f"round {r} {mode}: median {statistics.median(step):.3f} s", flush=True)
    result = {
        "steps_per_run": args.steps,
        "rounds": args.rounds,
        "cpu": os.cpu_count(),
        "sample_write_ms": sample_write_ms(out / "cost-none-0"),
        "modes": {
            m: {
                "steps": len(t),
                "median_s": statistics.median(t),
                "mean_s": statistics.fmean(t),
                "wall_median_s": statistics.median(walls[m]),
                "cpu": cpus[m],
                "times_s": t,
                "wall_s": walls[m],
            }
            for m, t in times.items()
        },
    }
    dest = Path(args.json) if args.json else default_out("view_cost")
    dest.parent.mkdir(parents=True, exist_ok=True)
    base = result["modes"]["none"]["median_s"]
    summary = "median step " + ", ".join(f"{m} {v['median_s'] / base:.3f}x" for m, v in result["modes"].items())
    dest.write_text(json.dumps(with_meta(result, summary + " of no viewer's"), indent=2) + "\n")
    print("| viewer | steps | median step (s) | mean step (s) | vs none | median wall between steps (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for m, v in result["modes"].items():
        print(
            f"| {m} | {v['steps']} | {v['median_s']:.3f} | {v['mean_s']:.3f} | {v['median_s'] / base:.3f}x "
            f"| {v['wall_median_s']:.3f} |"
        )
    print(f"writing one step's rollout sample: {result['sample_write_ms']:.2f} ms (median)")
    for m, v in result["modes"].items():
        print(m, "CPU seconds over the run:", v["cpu"])
