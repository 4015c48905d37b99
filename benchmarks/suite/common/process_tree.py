"""Run a command as a subprocess and watch its whole process tree: peak memory, CPU seconds, and the moments a
progress file gains lines (one line per finished training step). Used by the against_trl and real_model benchmarks.

    from suite.common.process_tree import run_watched
    trace = run_watched(["python", "-m", "agentrl_ray", "train", ...], Path("runs/x/metrics.jsonl"), Path("x.log"),
                        cwd=Path.cwd())

Memory: RSS from /proc/<pid>/statm of the process and all its descendants (for our side: the driver, Ray's GCS,
raylet, dashboard and every actor), every 0.5 s. RSS summed over a tree counts shared pages (libtorch, the object
store) once per process, so PSS, which splits each shared page among its users, is reported too; it comes from
/proc/<pid>/smaps_rollup, which costs ~3 ms of CPU per large process (the kernel walks its page tables: ~0.1 CPU-s
for our side's 27 processes), so it is read only every 5 s, lest the watcher itself load the machine. Peaks shorter
than the interval can be missed.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(root: int) -> list:
    """The psutil processes of `root` and all its descendants (none once it has exited)."""
    import psutil

    try:
        return [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _tree_sample(root: int) -> tuple[float, dict[int, tuple[str, float]]]:
    """(RSS bytes, {pid: (name, CPU seconds)}) over a process and its descendants: cheap /proc reads only."""
    import psutil

    rss = 0.0
    cpu = {}
    for p in tree(root):
        try:
            with open(f"/proc/{p.pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            t = p.cpu_times()
            cpu[p.pid] = (process_name(p.name()), t.user + t.system)
        except (OSError, psutil.Error):
            continue  # exited between listing and reading
    return rss, cpu


def _tree_pss(root: int) -> float:
    pss = 0.0
    for p in tree(root):
        try:
            with open(f"/proc/{p.pid}/smaps_rollup") as f:
                pss += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return pss


def process_name(title: str) -> str:
    """A Ray worker retitles itself per call (ray::RolloutWorker.rollout): keep the stable part to group by."""
    return title.split(".")[0] if title.startswith("ray::") else title


def _system_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all processes, all cores) since boot."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - t.iowait


class TreeWatch(threading.Thread):
    """Peak RSS and PSS of a process tree, and a mark each time a line is appended to a progress file (one line
    per finished step): its time, the tree's CPU seconds per process, and the whole machine's busy CPU seconds (so
    the CPU that other work took in a window can be told apart)."""

    def __init__(self, pid: int, progress: Path, interval: float = 0.5, pss_interval: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.progress, self.interval, self.pss_interval = pid, progress, interval, pss_interval
        self.peak_rss = self.peak_pss = 0.0
        self.cpu: dict[int, tuple[str, float]] = {}  # last seen per pid (exited processes keep their last value)
        self.marks: list[dict] = []
        self._halt = threading.Event()

    def cpu_total(self) -> float:
        return sum(seconds for _, seconds in self.cpu.values())

    def run(self) -> None:
        last_full = last_pss = 0.0
        while not self._halt.is_set():
            now = time.time()
            lines = self._count_lines()
            if now - last_pss >= self.pss_interval:
                self.peak_pss = max(self.peak_pss, _tree_pss(self.pid))
                last_pss = now
            if lines > len(self.marks) or now - last_full >= self.interval:
                rss, cpu = _tree_sample(self.pid)
                self.peak_rss = max(self.peak_rss, rss)
                self.cpu.update(cpu)
                last_full = now
                cpu_s = {str(pid): [name, seconds] for pid, (name, seconds) in self.cpu.items()}
                mark = {"time": now, "system_busy_s": _system_busy_s(), "cpu_s": cpu_s}
                self.marks += [mark] * (lines - len(self.marks))
            self._halt.wait(0.1)  # a cheap poll of the progress file; the /proc sweeps run at their intervals

    def _count_lines(self) -> int:
        try:
            return self.progress.read_bytes().count(b"\n")
        except OSError:
            return 0

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_watched(cmd: list[str], progress: Path, log: Path, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    load = os.getloadavg()[0]
    t0 = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        watch = TreeWatch(proc.pid, progress)
        watch.start()
        code = proc.wait()
        watch.stop()
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {code}; see {log}")
    return {
        "t_start": t0,
        "wall_s": time.time() - t0,
        "load_avg_1min_at_start": load,
        "peak_rss_gib": watch.peak_rss / 2**30,
        "peak_pss_gib": watch.peak_pss / 2**30,
        "cpu_s_total": watch.cpu_total(),
        "marks": watch.marks,
    }


def window_cpu(marks: list[dict], first: int, last: int) -> dict:
    """CPU between progress lines `first` and `last` (0-based): the tree's seconds, split by process name, and the
    share of the machine's cores that other work kept busy meanwhile."""
    a, b = marks[first], marks[last]
    per_name: dict[str, float] = {}
    for pid, (name, seconds) in b["cpu_s"].items():
        before = a["cpu_s"].get(pid, [name, 0.0])[1]
        per_name[process_name(name)] = per_name.get(process_name(name), 0.0) + seconds - before
    tree = sum(per_name.values())
    others = (b["system_busy_s"] - a["system_busy_s"]) - tree
    return {
        "tree_cpu_s": tree,
        "by_process": dict(sorted(per_name.items(), key=lambda kv: -kv[1])),
        "others_core_share": others / ((b["time"] - a["time"]) * (os.cpu_count() or 1)),
    }
