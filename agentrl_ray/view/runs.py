"""What the viewer knows about a run: only what the run writes into its folder, read as it grows.

A run folder (`run/outputs.py`, `driver.py`, `learner/watch.py`, `trained/evaluate.py`) holds `config.json` (at the
start), `metrics.jsonl` (a line per step, appended), `rollouts/step_<step>.jsonl` (each written whole, by an atomic
rename), `stop.json` and `summary.json` (at the end), and `eval_<step>/report.json` + `transcripts.jsonl` (written by
`agentrl-ray eval`). Nothing here writes to the folder or talks to the run's processes: the viewer costs the
training a `stat` and the new bytes of metrics.jsonl per poll.

A run's status: `done` once summary.json exists; `stopped` when it has no summary and nothing in it changed for
a while (a crash, a kill, a guard that stopped it: `stop.json` says which when it exists); `training` otherwise.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STALE_S = 300.0  # no write for this long (and 5x the slowest step) and no summary: the run's process is gone


def find_runs(paths: list[Path]) -> dict[str, Path]:
    """{name: folder} of the runs at `paths`: each a run folder itself, or a folder of run folders (`runs/`)."""
    out: dict[str, Path] = {}
    for path in paths:
        folders = [path] if is_run(path) else sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))
        for folder in folders:
            name = folder.name if folder.name not in out else f"{folder.parent.name}/{folder.name}"
            out[name] = folder
    return out


def is_run(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "metrics.jsonl").is_file()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or mid-write by a writer that does not rename
        return None


@dataclass
class MetricsTail:
    """metrics.jsonl read incrementally: each call reads only the bytes appended since the last one. A file that
    shrank (a resumed run truncates the steps it redoes) is read again from the start."""

    path: Path
    offset: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return self.records
        if size < self.offset:
            self.offset, self.records = 0, []
        if size == self.offset:
            return self.records
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
        for line in chunk[:end].splitlines():
            if line.strip():
                self.records.append(json.loads(line))
        self.offset += end
        return self.records


class RunFolder:
    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.metrics = MetricsTail(path / "metrics.jsonl")

    def status(self) -> dict[str, Any]:
        records = self.metrics.read()
        summary = _read_json(self.path / "summary.json")
        stop = _read_json(self.path / "stop.json")
        steps = [r["step"] for r in records if "reward/mean" in r]
        if summary is not None:
            state = "done"
        else:
            slowest = max((r.get("time/step_s", 0.0) for r in records), default=0.0)
            idle = time.time() - self._last_write()
            state = "stopped" if stop is not None or idle > max(STALE_S, 5 * slowest) else "training"
        config = _read_json(self.path / "config.json") or {}
        return {
            "name": self.name,
            "path": str(self.path),
            "status": state,
            "step": steps[-1] if steps else 0,
            "steps": config.get("run", {}).get("steps"),
            "stop_reason": (summary or stop or {}).get("stop_reason"),
            "summary": summary,
            "config": config,
        }

    def _last_write(self) -> float:
        paths = [self.path / n for n in ("metrics.jsonl", "config.json", "rollouts")]
        return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)

    def records(self, since: int = 0) -> list[dict[str, Any]]:
        """metrics.jsonl's records from the `since`-th on (the page asks for the ones it has not seen)."""
        return self.metrics.read()[since:]

    def rollout_steps(self) -> list[int]:
        folder = self.path / "rollouts"
        if not folder.is_dir():
            return []
        return sorted(int(p.stem.removeprefix("step_")) for p in folder.glob("step_*.jsonl"))

    def rollouts(
        self, step: int | None, min_reward: float | None, max_reward: float | None, errors: bool, limit: int = 200
    ) -> list[dict[str, Any]]:
        """The saved rollouts of one step (the newest when `step` is None), filtered: a reward range, and
        `errors` for only those with a failed tool call, a failed environment step or a truncated answer."""
        steps = self.rollout_steps()
        if not steps:
            return []
        step = steps[-1] if step is None else step
        path = self.path / "rollouts" / f"step_{step:06d}.jsonl"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            if min_reward is not None and r["reward"] < min_reward:
                continue
            if max_reward is not None and r["reward"] > max_reward:
                continue
            if errors and not has_error(r):
                continue
            out.append(r)
        return out[:limit]

    def evals(self) -> list[dict[str, Any]]:
        """The reports of `agentrl-ray eval` written into this run's folder, newest step first."""
        out = []
        for folder in sorted(self.path.glob("eval_*"), reverse=True):
            report = _read_json(folder / "report.json")
            if report is not None:
                out.append({"name": folder.name, **report})
        return out

    def transcripts(self, eval_name: str, limit: int = 200) -> list[dict[str, Any]]:
        path = self.path / eval_name / "transcripts.jsonl"
        if "/" in eval_name or not eval_name.startswith("eval_") or not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()[:limit] if line.strip()]


def has_error(record: dict[str, Any]) -> bool:
    """A trace record (rollouts/) or an eval transcript with a tool error, a failed step or a cut-off answer."""
    errors = record.get("num_tool_errors", record.get("tool_errors", 0)) + record.get("num_step_errors", 0)
    return errors > 0 or record.get("finish_reason") == "length"
