"""Who takes the cores while the learner runs: run a command, read the CPU time of every thread of its process tree
from /proc once a second, then sum each process's and thread's CPU over the seconds in which the learner process
(`--phase-of`, a process-name substring) used more than `--busy` cores.

    python benchmarks/thread_cpu.py --out runs/probe/threads.jsonl -- agentrl-ray train CONFIG OVERRIDES...
    python benchmarks/thread_cpu.py --analyze runs/probe/threads.jsonl --json summary.json

A sweep reads ~1,000 small files (27 processes, their threads): ~1% of a core at one sweep a second.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[str, tuple[str, float]]:
    """{tid: (thread name, CPU seconds)} of one process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited between listing and reading
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / HZ)  # utime + stime
    return out


def record(cmd: list[str], out_path: str, interval: float) -> int:
    import psutil

    with open(out_path, "w") as out, open(out_path + ".log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            sample = {"t": time.time(), "p": {}}
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.Error:
                break
            for p in tree:
                try:
                    sample["p"][p.pid] = [p.name(), _threads(p.pid)]
                except (psutil.Error, OSError):
                    continue
            out.write(json.dumps(sample) + "\n")
            out.flush()
            time.sleep(interval)
        return proc.wait()


def analyze(path: str, phase_of: str, busy: float) -> dict:
    samples = [json.loads(line) for line in open(path)]
    by_process: dict[str, float] = collections.defaultdict(float)
    by_thread: dict[str, float] = collections.defaultdict(float)
    wall = 0.0
    for a, b in zip(samples, samples[1:]):
        dt = b["t"] - a["t"]
        deltas = {}
        for pid, (name, threads) in b["p"].items():
            before = a["p"].get(pid)
            if before is None:
                continue
            deltas[pid] = (
                name,
                {tid: (tn, s - before[1][tid][1]) for tid, (tn, s) in threads.items() if tid in before[1]},
            )
        learner = sum(sum(d for _, d in th.values()) for name, th in deltas.values() if phase_of in name)
        if learner / dt <= busy:
            continue
        wall += dt
        for name, th in deltas.values():
            for thread_name, d in th.values():
                by_process[name] += d
                by_thread[f"{name} / {thread_name}"] += d
    cores = {k: round(v / wall, 4) for k, v in sorted(by_process.items(), key=lambda x: -x[1]) if v > 0.01}
    threads = {k: round(v, 2) for k, v in sorted(by_thread.items(), key=lambda x: -x[1])[:25] if v > 0.05}
    return {
        "phase_of": phase_of,
        "busy_cores_above": busy,
        "phase_wall_s": round(wall, 1),
        "cores": cores,
        "thread_cpu_s": threads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="record: the JSONL of samples (the command's output goes to <out>.log)")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--analyze", help="a JSONL recorded before")
    ap.add_argument("--phase-of", default="RayTrainWorker")
    ap.add_argument("--busy", type=float, default=1.4, help="cores the --phase-of process uses in its phase")
    ap.add_argument("--json", help="analyze: write the summary here too")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    path = args.analyze
    if path is None:
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not (args.out and cmd):
            ap.error("give --out and a command after --, or --analyze")
        code = record(cmd, args.out, args.interval)
        if code:
            sys.exit(f"the command failed with exit code {code}; see {args.out}.log")
        path = args.out
    summary = analyze(path, args.phase_of, args.busy)
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
