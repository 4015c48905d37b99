"""The console is the user's (STYLE.md 15): our own lines on screen, other programs' output in a file of the run.

`quiet(path)` (`agentrl-ray train` and `chat`, unless `--verbose` or run.log_level=debug) points this process's
file descriptors 1 and 2 at `path`, so whatever else writes to them lands there, Python or native: Ray's driver-side
lines and its C++ core worker's, vLLM's, DeepSpeed's, transformers', OpenMP's and tcmalloc's warnings. Redirecting
the descriptors, not `sys.stdout`, is what catches the native writers, and the loggers that other libraries set up
later still write to `sys.stdout`/`sys.stderr`, i.e. to the file. Our own lines go to `out()`: a copy of the
terminal's stdout taken before. Ray's workers do not forward their output to the driver
(`ray.init(log_to_driver=False)`, local_ray.py), and in a Ray this process starts every worker points its own
descriptors at the same file as it starts (Ray's worker setup hook in local_ray.py).

On leaving `quiet` the descriptors are put back before an exception goes on, so a crash's traceback is on screen;
a folder `quiet` created that holds nothing but the log is removed then (a run refused before it started).
Outside `quiet` (the Python API, the tests, --verbose) `out()` is `sys.stdout`, nothing is redirected and Ray
forwards its workers' output as usual.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

_console: dict[str, object] = {"out": None, "log": None}


def out() -> TextIO:
    """Where our own lines go: the terminal inside `quiet`, else sys.stdout (looked up at each call)."""
    return _console["out"] or sys.stdout  # type: ignore[return-value]


def log_file() -> Path | None:
    """The file that other programs' output goes to, inside `quiet`; None outside."""
    return _console["log"]  # type: ignore[return-value]


def say(line: str) -> None:
    print(line, file=out(), flush=True)


@contextlib.contextmanager
def quiet(path: Path, what: str = "Ray, vLLM, DeepSpeed and transformers") -> Iterator[Path]:
    """Other programs' output to `path` until the block ends; the first line on screen names the file."""
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    ray_was_up = _ray_up()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    print(f"agentrl-ray: the output of {what} goes to {path} (--verbose shows it here)", file=terminal, flush=True)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _console.update(out=terminal, log=path)
    ours = logging.StreamHandler(terminal)  # our warnings on screen too (and, through the root logger, in the file)
    ours.setLevel(logging.WARNING)
    ours.setFormatter(logging.Formatter("agentrl-ray: %(message)s"))
    logging.getLogger("agentrl_ray").addHandler(ours)
    failed = True
    try:
        yield path
        if _ray_up() and not ray_was_up:
            sys.modules["ray"].shutdown()  # a Ray started inside goes now, its parting lines into the file too
        failed = False
    finally:
        logging.getLogger("agentrl_ray").removeHandler(ours)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in saved:
            os.close(f)
        _console.update(out=None, log=None)
        terminal.close()
        if failed and created and list(path.parent.iterdir()) == [path]:  # a run that never started (a user's
            shutil.rmtree(path.parent)  # mistake, refused before anything else was written) leaves nothing


def _ray_up() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def eta_text(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


NO_ETA = "--:--"
# tqdm's default layout with our ETA (a literal, set at each update) where tqdm's own {remaining} goes: tqdm's comes
# from its rate since the bar started, start-up included.
_BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<%s, {rate_fmt}{postfix}]"


class Progress:
    """Progress with an ETA: a tqdm bar on a terminal, with our lines printed above it; elsewhere (CI, a `ray job
    submit` log) plain lines, each with the ETA, and every `every`-th update a line of its own.

    The ETA is the steps left times the median step time, plus the evaluations left (they run after the steps in
    `eval_steps`) times the median evaluation time, from the second step on (`NO_ETA` before). A step's time is
    what `update` is told it measured, else the time since the previous update; the first update's gap is not a
    step time, it holds the start-up (model load, Ray, engines), which made the time since start over the steps
    done 40x too long at step 1. Medians, so one slow step (a checkpoint, a compile) does not swing the ETA.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        initial: int = 0,
        unit: str = "step",
        every: int = 0,
        eval_steps: Sequence[int] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.every, self.done = total, desc, every, initial
        self.first, self.eval_steps = initial, sorted(eval_steps)
        self.clock = clock
        self.last = clock()  # when the previous update came
        self.step_times: list[float] = []  # seconds, kept sorted for the median
        self.eval_times: list[float] = []
        self.stream = out()
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit=unit,
                file=self.stream,
                dynamic_ncols=True,
                bar_format=_BAR % NO_ETA,
            )

    def eta_seconds(self) -> float | None:
        """Seconds left; None before the second step since this progress began."""
        if self.done - self.first < 2 or not self.step_times:
            return None
        evals_left = len(self.eval_steps) - bisect.bisect_right(self.eval_steps, self.done)
        # Until an evaluation has run, evaluations are priced at 0, not guessed: their cost next to a step's
        # depends on the held-out set. The first one (after step run.eval_every) prices the rest.
        eval_s = _median(self.eval_times) if self.eval_times else 0.0
        return (self.total - self.done) * _median(self.step_times) + evals_left * eval_s

    def eta(self) -> str:
        seconds = self.eta_seconds()
        return NO_ETA if seconds is None else eta_text(seconds)

    def update(
        self,
        n: int = 1,
        line: str | None = None,
        note: str | None = None,
        *,
        step_s: float | None = None,
        eval_s: float | None = None,
    ) -> None:
        """Count `n` more done; `line`: one of ours to print (above the bar); `note`: the bar's status; `step_s`:
        the step's own measured time; `eval_s`: the time of an evaluation that ran after it."""
        now = self.clock()
        if step_s is not None:
            bisect.insort(self.step_times, step_s)
        elif n > 0 and self.done > self.first:  # not the first update: its gap holds the start-up
            for _ in range(n):
                bisect.insort(self.step_times, (now - self.last) / n)
        if eval_s is not None:
            bisect.insort(self.eval_times, eval_s)
        self.last = now
        self.done += n
        if self.bar is not None:
            if line is not None:
                self.bar.write(line, file=self.stream)
            if note is not None:
                self.bar.set_postfix_str(note, refresh=False)
            self.bar.bar_format = _BAR % self.eta()
            self.bar.update(n)
            return
        if line is not None:
            print(f"{line} | eta {self.eta()}", file=self.stream, flush=True)
        elif self.every and (self.done % self.every == 0 or self.done == self.total):
            text = f"{self.desc} {self.done}/{self.total}" + (f" {note}" if note else "")
            print(f"{text} | eta {self.eta()}", file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """A line of ours that counts nothing (e.g. the evaluation before the first step)."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _median(sorted_values: list[float]) -> float:
    mid = len(sorted_values) // 2
    return sorted_values[mid] if len(sorted_values) % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2
