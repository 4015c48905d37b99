"""One cgroup per sandbox uid slot: aggregate memory (files in its tmpfs included) and process limits for a run.

RLIMIT_AS bounds each process and RLIMIT_NPROC counts a uid's processes, but N processes of 500 MB each are N x 500
MB. A cgroup bounds the run's processes together, and its member list makes "kill everything of this run" exact.

Detected once per process: cgroup v2 when the `memory` and `pids` controllers can be enabled below our own cgroup,
else cgroup v1 when both controllers are mounted and our cgroup in each is writable. Slot cgroups are created under
the trainer's own cgroup (so a container's limit still holds around them) as `agentrl_ray-sandbox/<slot>` and
reused: one per concurrent sandbox, like the uids. The child attaches itself (`echo 0 > cgroup.procs`, "the writer")
from the launcher shell before it drops privileges, so nothing of the run ever runs outside the cgroup.
"""

from __future__ import annotations

import functools
import os
import signal
from dataclasses import dataclass
from pathlib import Path

_GROUP = "agentrl_ray-sandbox"
_CONTROLLERS = ("memory", "pids")


@dataclass(frozen=True)
class SlotCgroup:
    """The memory and pids cgroup of one sandbox slot (the same directory under cgroup v2)."""

    version: int
    memory: Path
    pids: Path

    def procs_files(self) -> list[Path]:
        """Files the launcher writes `0` into to join (one per hierarchy)."""
        return sorted({self.memory / "cgroup.procs", self.pids / "cgroup.procs"})

    def prepare(self, memory_bytes: int, max_tasks: int) -> int:
        """Set the limits for the next run and reset its peak; returns the OOM-kill count so far."""
        if self.version == 2:
            _write(self.memory / "memory.max", memory_bytes)
            _write(self.memory / "memory.swap.max", 0, missing_ok=True)
            _write(self.memory / "memory.peak", 0, missing_ok=True)  # resettable since Linux 6.12
        else:
            _write(self.memory / "memory.limit_in_bytes", memory_bytes)
            _write(self.memory / "memory.max_usage_in_bytes", 0)
        _write(self.pids / "pids.max", max_tasks)
        return self.oom_kills()

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.memory / name).read_text())
        except FileNotFoundError:
            return None

    def oom_kills(self) -> int:
        """Processes the kernel killed because the cgroup ran out of memory (cumulative)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.memory / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill_all(self) -> None:
        """SIGKILL every member (repeated: a member may fork while we read the list)."""
        if self.version == 2:
            _write(self.pids / "cgroup.kill", 1)
            return
        for _ in range(100):
            pids = [int(p) for p in (self.pids / "cgroup.procs").read_text().split()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def slot_cgroup(slot: int) -> SlotCgroup | None:
    """The cgroup of `slot`, created on first use; None where cgroups are unavailable (see `unavailable_reason`)."""
    base = _base()
    if isinstance(base, str):
        return None
    return _slot(base, slot)


def unavailable_reason() -> str | None:
    """None when sandbox cgroups work here, else why not."""
    base = _base()
    return base if isinstance(base, str) else None


@functools.cache
def _slot(base: SlotCgroup, slot: int) -> SlotCgroup:
    cg = SlotCgroup(base.version, base.memory / str(slot), base.pids / str(slot))
    for path in {cg.memory, cg.pids}:
        path.mkdir(exist_ok=True)
    return cg


@functools.cache
def _base() -> SlotCgroup | str:
    """The `agentrl_ray-sandbox` parent cgroup (created), or why there is none."""
    if os.geteuid() != 0:
        return "not root: no writable cgroup (a delegated cgroup is not used)"
    mine = _own_cgroups()
    v2 = _v2_base(mine)
    if isinstance(v2, SlotCgroup):
        return v2
    v1 = _v1_base(mine)
    return v1 if isinstance(v1, SlotCgroup) else f"cgroup v2: {v2}; cgroup v1: {v1}"


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    mine = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            mine[name] = path
    return mine


def _mounts(fstype: str) -> list[tuple[str, set[str]]]:
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, options, *_ = line.split()
        if kind == fstype:
            found.append((where, set(options.split(","))))
    return found


def _v2_base(mine: dict[str, str]) -> SlotCgroup | str:
    mounts = _mounts("cgroup2")
    if not mounts or "" not in mine:
        return "not mounted"
    own = Path(mounts[0][0] + mine[""])
    missing = set(_CONTROLLERS) - set((own / "cgroup.controllers").read_text().split())
    if missing:
        return f"controllers {sorted(missing)} not available in {own} (bound to cgroup v1?)"
    group = own / _GROUP
    try:
        # A cgroup with member processes cannot pass controllers down (no internal processes), unless it is the root.
        _write(own / "cgroup.subtree_control", " ".join(f"+{c}" for c in _CONTROLLERS))
        group.mkdir(exist_ok=True)
        _write(group / "cgroup.subtree_control", " ".join(f"+{c}" for c in _CONTROLLERS))
    except OSError as e:
        return f"cannot enable memory and pids below {own}: {e}"
    return SlotCgroup(2, group, group)


def _v1_base(mine: dict[str, str]) -> SlotCgroup | str:
    dirs = {}
    for controller in _CONTROLLERS:
        mount = next((where for where, opts in _mounts("cgroup") if controller in opts), None)
        if mount is None or controller not in mine:
            return f"the {controller} controller is not mounted"
        dirs[controller] = Path(mount + mine[controller].rstrip("/")) / _GROUP
        try:
            dirs[controller].mkdir(exist_ok=True)
        except OSError as e:
            return f"cannot create {dirs[controller]}: {e}"
    return SlotCgroup(1, dirs["memory"], dirs["pids"])


def _write(path: Path, value: object, missing_ok: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not missing_ok:
            raise
