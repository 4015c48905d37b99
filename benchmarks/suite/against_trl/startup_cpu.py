"""Where a run's start-up goes: the CPU-seconds and RSS of every process of the run's tree at the moment step 1
starts (the first `time/step_s` record's end minus its length), and what that means on this machine's cores.

Start-up on a machine of C cores cannot be shorter than (CPU-seconds spent by every process before step 1) / C,
whatever overlaps with what; this prints that bound next to the measured start-up. The run is stopped once step 1
has ended.

    python benchmarks/run.py against_trl --mode startup_cpu --run-dir runs/startup/s -- \\
        agentrl-ray train examples/calculator/config.yaml run.output_dir=runs/startup run.name=s run.steps=3 \\
        run.eval_every=0 run.eval_at_start=false
    # the side-by-side's 0.5B shape: its overrides are in docs/benchmarks.md, "Current results"

Step 1 must not be the run's last step (run.steps >= 2) and must not evaluate (run.eval_every=0): its record is
written after those, and this takes the record's arrival as step 1's end.

With --phases, it also prints where the start-up's wall time goes, from the marks each process of the run writes
(agentrl_ray/infra/startup.py): when each process started, when its imports were done, and each phase of the
driver (config, Ray, preflight, placement), the engines (tokenizer, engine load), the env hosts and the learner
(model built, engines ready, weight sync set up, the step-0 evaluation, the first step):

    python benchmarks/run.py against_trl --mode startup_cpu --phases --run-dir runs/startup/p -- agentrl-ray train \
        examples/calculator/config.yaml run.output_dir=runs/startup run.name=p run.steps=2

Writes JSON with --out. CPU-seconds include each process's waited-for children (psutil's children_user/system).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from results_path import with_meta
from suite.common.process_tree import tree  # the side-by-side's tree walk

STARTUP_LOG = "AGENTRL_STARTUP_LOG"  # agentrl_ray/infra/startup.py's ENV


def sample(root: int) -> dict[int, tuple[str, float, int]]:
    """pid -> (command line, CPU-seconds, RSS bytes) for the root and all its descendants."""
    out = {}
    for p in tree(root):
        try:
            t = p.cpu_times()
            out[p.pid] = (
                " ".join(p.cmdline())[:60],
                t.user + t.system + t.children_user + t.children_system,
                p.memory_info().rss,
            )
        except psutil.Error:
            continue  # exited between listing and reading
    return out


def first_step(metrics: Path) -> dict | None:
    if not metrics.exists():
        return None
    for line in metrics.read_text().splitlines():
        if '"time/step_s"' in line:
            try:
                return json.loads(line)
            except json.JSONDecodeError:  # the line is being written
                return None
    return None


def phases(marks_file: Path, t0: float) -> list[dict]:
    """The run's start-up marks in time order, as seconds since launch; each process's start and its first mark
    (everything it imported before) come first for that process."""
    marks = (
        [json.loads(line) for line in marks_file.read_text().splitlines() if line.strip()]
        if marks_file.exists()
        else []
    )
    out, seen = [], set()
    for m in sorted(marks, key=lambda m: m["t"]):
        if m["pid"] not in seen:
            seen.add(m["pid"])
            out.append(
                {"at_s": m["process_start"] - t0, "role": m["role"], "pid": m["pid"], "phase": "process started"}
            )
        out.append({"at_s": m["t"] - t0, "role": m["role"], "pid": m["pid"], "phase": m["phase"]})
    return sorted(out, key=lambda r: r["at_s"])


def print_phases(rows: list[dict]) -> None:
    """One line a mark: seconds since launch, the time since the same process's previous mark, role, phase."""
    last: dict[int, float] = {}
    print(f"{'at s':>7} {'+s':>6}  {'process':<12} phase")
    for r in rows:
        gap = r["at_s"] - last.get(r["pid"], r["at_s"])
        last[r["pid"]] = r["at_s"]
        print(f"{r['at_s']:7.1f} {gap:6.1f}  {r['role']:<12} {r['phase']}")


def main(argv: list[str], prog: str) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, help="the run's folder (where metrics.jsonl appears)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples of the process tree")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", help="JSON file for the result")
    ap.add_argument("--phases", action="store_true", help="also print the start-up's phases, marked by each process")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the run's command, after --")
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    metrics = Path(a.run_dir) / "metrics.jsonl"
    env = dict(os.environ)
    marks_file = Path(tempfile.mkdtemp(prefix="startup-")) / "marks.jsonl"
    if a.phases:
        env[STARTUP_LOG] = str(marks_file)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    series: list[tuple[float, dict]] = []
    record = None
    try:
        while proc.poll() is None and time.time() - t0 < a.timeout:
            series.append((time.time() - t0, sample(proc.pid)))
            record = first_step(metrics)
            if record is not None:
                break
            time.sleep(a.interval)
        end = time.time() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if record is None:
        raise SystemExit(f"no step ended in {metrics} (the run's exit code: {proc.returncode})")
    start = end - record["time/step_s"]
    at = max(0, bisect.bisect_right([t for t, _ in series], start) - 1)
    last_seen: dict[int, tuple[str, float, int]] = {}
    for _, snap in series[: at + 1]:
        last_seen.update(snap)  # a process that ended before step 1 keeps its last sample
    live = series[at][1]
    rows = sorted(
        (
            {"pid": pid, "cmd": v[0], "cpu_s": v[1], "rss_mib": live[pid][2] / 2**20 if pid in live else 0.0}
            for pid, v in last_seen.items()
        ),
        key=lambda r: -r["cpu_s"],
    )
    cores = psutil.cpu_count()
    total = sum(r["cpu_s"] for r in rows)
    result = {
        "command": cmd,
        "startup_s": start,
        "cpu_s_before_step1": total,
        "cores": cores,
        "bound_s": total / cores,
        "processes": rows,
    }
    print(
        f"step 1 starts at {start:.1f} s; CPU-seconds of the tree by then {total:.1f}, "
        f"so at least {total / cores:.1f} s on {cores} cores"
    )
    for r in rows[:16]:
        print(f"{r['cpu_s']:6.1f} CPU-s {r['rss_mib']:7.0f} MiB  {r['cmd']}")
    if a.phases:
        result["phases"] = phases(marks_file, t0)
        print_phases(result["phases"])
    if a.out:
        summary = f"start-up {start:.1f} s; {total:.1f} CPU-s before step 1: >= {total / cores:.1f} s on {cores} cores"
        Path(a.out).write_text(json.dumps(with_meta(result, summary), indent=1))
