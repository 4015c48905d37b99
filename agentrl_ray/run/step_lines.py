"""The training console: one line per step (and per evaluation) under a progress bar with an ETA.

The driver shows them, not learner rank 0: its console is the user's (infra/console.py), and a learner's prints
would reach it only through Ray's forwarding of every worker's output. `StepLines` follows metrics.jsonl, which the
MetricsLog actor on the driver's node writes as each step ends (run/outputs.py), from a thread of the driver.

The ETA (infra/console.py's `Progress`) prices steps and evaluations apart: a step by its own `time/step_s`, an
evaluation by what the gap between its record and the previous step's adds to that step's time (the records'
`time`, when the MetricsLog wrote them; the evaluation runs after `time/step_s` was taken, learner/loop.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from agentrl_ray.infra.console import Progress

POLL_S = 0.5


def eval_text(m: dict[str, Any]) -> str:
    """A held-out evaluation for the progress line: "success 0.885 (pass@1 95% CI 0.850-0.920, pass@2 0.930)"."""
    text = f"success {m['eval/success']:.3f}"
    if "eval/pass@1_ci95_lo" in m:
        more = [f"pass@{k} {m[f'eval/pass@{k}']:.3f}" for k in (2, 4, 8, 16, 32) if f"eval/pass@{k}" in m]
        ci = f"pass@1 95% CI {m['eval/pass@1_ci95_lo']:.3f}-{m['eval/pass@1_ci95_hi']:.3f}"
        text += f" ({', '.join([ci, *more])})"
    return text


def eval_steps(total_steps: int, eval_every: int) -> list[int]:
    """The steps after which the learner evaluates (learner/loop.py): every `eval_every`-th, and the last."""
    return [s for s in range(1, total_steps + 1) if (eval_every and s % eval_every == 0) or s == total_steps]


def step_line(step: int, m: dict[str, Any], total_steps: int) -> str:
    if "reward/mean" not in m:  # the evaluation before the first step
        return f"step {step:>4}/{total_steps} | eval {eval_text(m)} (before training)"
    line = (
        f"step {step:>4}/{total_steps} | reward {m['reward/mean']:.3f} | success {m['rollout/success']:.2f} "
        f"| tokens {m['rollout/sampled_tokens']:>6} | time {m['time/step_s']:.1f}s "
        f"(learner {m['time/learner_s']:.1f} sync {m['time/sync_s']:.2f} | rollout "
        f"{m.get('time/rollout_worker_s', 0.0):.1f}, learner waited {m['time/rollout_s']:.1f})"
    )
    if "eval/success" in m:
        line += f" | eval {eval_text(m)}"
    if "health/level" in m:  # the verdict of health.HealthMonitor
        line += f" | health {('ok', 'WARN', 'RED')[m['health/level']]}"
        line += f": {m['health/reasons']}" if m["health/reasons"] else ""
    return line


class StepLines:
    """Shows each record metrics.jsonl gains, from a thread, until `close()`. Records there at the start (a resumed
    run's) are not shown again; a record seen once (by step and time) is shown once, even when a resumed learner
    rewrites the file."""

    def __init__(self, path: Path, total_steps: int, eval_every: int = 0) -> None:
        self.path, self.total = path, total_steps
        self.offset, self.inode, self.seen = 0, None, set()
        earlier = self._new_records()
        self.progress = Progress(
            total_steps,
            "training",
            initial=max((r["step"] for r in earlier), default=0),
            eval_steps=eval_steps(total_steps, eval_every),
        )
        self.previous: dict[str, Any] | None = None  # the last record shown (not an earlier run's: another clock)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="step-lines", daemon=True)
        self.thread.start()

    def _new_records(self) -> list[dict[str, Any]]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if stat.st_ino != self.inode or stat.st_size < self.offset:  # new, or replaced: a resumed learner
            self.offset, self.inode = 0, stat.st_ino  # rewrites it without the steps it will redo
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        new = []
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:  # a torn line a crash left (run/resume.py repairs the file)
                continue
            if isinstance(record, dict) and "step" in record and ("reward/mean" in record or "eval/success" in record):
                key = (record.get("step"), record.get("time"))
                if key not in self.seen:
                    self.seen.add(key)
                    new.append(record)
        return new

    def show_new(self) -> None:
        for r in self._new_records():
            line = step_line(r["step"], r, self.total)
            if "reward/mean" in r:
                n = max(0, r["step"] - self.progress.done)
                self.progress.update(n, line=line, step_s=r["time/step_s"], eval_s=self._eval_s(r))
            else:
                self.progress.write(line)
            self.previous = r

    def _eval_s(self, r: dict[str, Any]) -> float | None:
        """The time of the evaluation in step record `r`, when the record before it is its step's predecessor."""
        p = self.previous
        if "eval/success" not in r or p is None or p["step"] != r["step"] - 1 or r["time"] < p["time"]:
            return None
        return max(0.0, r["time"] - p["time"] - r["time/step_s"])

    def _follow(self) -> None:
        while not self.stopping.wait(POLL_S):
            self.show_new()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.show_new()
        self.progress.close()
