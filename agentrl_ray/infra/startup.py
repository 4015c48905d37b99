"""Where a run's start-up goes: each process of the run marks the moments its start-up passes (imports done, Ray
up, engine loaded, learner built, first step), when $AGENTRL_STARTUP_LOG names a file. Off by default, and then a
mark costs one environment lookup. `benchmarks/run.py against_trl --mode startup_cpu --phases` sets it and prints
the timeline.

One JSON line per mark: wall time, the process's own start (so imports before the first mark show), pid, role,
phase. Local runs only: every process appends to the same file, which Ray's local workers inherit through the
environment of the Ray the driver starts.
"""

from __future__ import annotations

import json
import os
import time

ENV = "AGENTRL_STARTUP_LOG"


def mark(role: str, phase: str) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    import psutil

    line = {
        "t": time.time(),
        "process_start": psutil.Process().create_time(),
        "pid": os.getpid(),
        "role": role,
        "phase": phase,
    }
    with open(path, "a") as f:  # one short write: lines of several processes do not interleave
        f.write(json.dumps(line) + "\n")
