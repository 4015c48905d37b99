"""One unprivileged uid per running sandbox (root only), leased across processes, and killing every process of it.

Why a uid per run (see docs/sandbox.md): RLIMIT_NPROC is not enforced for root and counts every process of a uid,
so a shared uid would let sandboxes starve and signal each other; with its own uid a run cannot write the host's
files, signal or ptrace other runs or the trainer, or read their /proc/<pid>/environ.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import signal
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

SANDBOX_UID_BASE = 2_000_000_000  # far above login users and the usual subuid ranges; below 2**31
SANDBOX_UID_SLOTS = 4096
_SLOT_DIR = Path("/run/agentrl_ray-sandbox")  # /run is root-only: a sandbox cannot plant this directory


@contextmanager
def sandbox_uid() -> Iterator[int | None]:
    """As root, lease a uid that no other running sandbox (in any process) holds. The run kills every process of
    the uid before it returns; a lease left dirty (its holder died mid-run) is cleaned by the next holder."""
    if os.geteuid() != 0:
        yield None
        return
    lock_fd, uid = _lease_slot()
    try:
        if os.pread(lock_fd, 1, 0) == b"1":
            kill_uid(uid)
        os.pwrite(lock_fd, b"1", 0)
        yield uid
        os.pwrite(lock_fd, b"0", 0)  # not reached when the run raised: the next holder cleans up
    finally:
        os.close(lock_fd)


def _lease_slot() -> tuple[int, int]:
    _SLOT_DIR.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(_SLOT_DIR)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise RuntimeError(f"{_SLOT_DIR} must be a directory owned by root with mode 0700")
    first = random.randrange(SANDBOX_UID_SLOTS)  # spread concurrent searches
    for i in range(SANDBOX_UID_SLOTS):
        slot = (first + i) % SANDBOX_UID_SLOTS
        fd = os.open(_SLOT_DIR / str(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd, SANDBOX_UID_BASE + slot
    raise RuntimeError(f"all {SANDBOX_UID_SLOTS} sandbox uids are in use")


def kill_uid(uid: int, patience_s: float = 2.0) -> None:
    """SIGKILL every live process of `uid`, again until none is left (one may fork while we look). Zombies are
    dead already. The /proc scan is cheap next to a run and runs once per run (numbers in docs/sandbox.md)."""
    if uid < SANDBOX_UID_BASE:  # never a real user's processes, let alone root's
        raise ValueError(f"refusing to kill the processes of uid {uid}: not a sandbox uid")
    give_up = time.monotonic() + patience_s
    while pids := live_pids(uid):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > give_up:
            logger.error("sandbox: processes %s of uid %d survive SIGKILL", pids, uid)
            return
        time.sleep(0.001)


def live_pids(uid: int) -> list[int]:
    """Processes whose real uid is `uid`, from /proc/<pid>/status (the owner of /proc/<pid> would be cheaper to
    read, but a process can hide behind root's by making itself non-dumpable)."""
    pids, wanted = [], b"\nUid:\t%d\t" % uid
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/status", os.O_RDONLY)
            try:
                status = os.read(fd, 1024)
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):  # exited while we looked
            continue
        if wanted in status and b"\nState:\tZ" not in status:
            pids.append(int(name))
    return pids
