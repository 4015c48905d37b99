"""Confine a freshly forked child (an environment at `env.isolation = sandbox`, an agent program at `sandbox` or
`auto`) before any of the user's code runs.

The same layers as `sandbox.py` gives a `run_python` program, applied in-process because the child is a fork of the
zygote, not an exec: it runs as root for a moment, single-threaded, then drops to its leased uid for good.
1. joins its slot's memory and pids cgroups (the aggregate bound on it and everything it forks, tmpfs included);
2. new mount, IPC and (unless `network`) network namespaces: a fresh size-limited tmpfs on /tmp, /var/tmp and
   /dev/shm (nosuid, nodev), its own SysV IPC, only a downed loopback, and a /proc of its own that shows only
   its uid's processes (`hidepid=invisible`: not the trainer's or Ray's command lines; Linux 5.8+, where procfs
   options are per mount, see `hidepid_available`);
3. rlimits: address space (`memory_mb` beyond what the zygote mapped), processes (of its uid), open files, file
   size, no core dumps;
4. no supplementary groups, the leased uid/gid (all capabilities gone), no_new_privs;
5. an environment of only PATH, HOME/TMPDIR=/tmp, LANG; stdin/stdout/stderr on /dev/null; no other descriptor
   but its socket.
Not here (see docs/sandbox.md): a PID namespace (the child must stay the zygote's child so the host can kill and
reap it), a CPU-time rlimit (a trajectory's calls add up; each call is bounded by `env.tool_timeout_s`).

Without a uid (`Confinement.uid` None: an agent program at `auto`), only 1 (where the host has cgroups) and 3 less
the process count (RLIMIT_NPROC counts every process of the host's uid, and is not enforced for root) apply, and
descriptors other than stdin/stdout/stderr and its socket are closed: the child keeps the host's uid, files,
network and environment.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass

from agentrl_ray.envs.isolation.sandbox import SANDBOX_PATH, SandboxLimits

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
_HIDEPID = b"hidepid=invisible"  # rejected (EINVAL) by kernels before 5.8, whose hidepid=2 would change every /proc
_PR_SET_NO_NEW_PRIVS = 38


@dataclass(frozen=True)
class Confinement:
    uid: int | None
    """The leased unprivileged uid (and gid) the child runs as (`sandbox_uids.py`); None: it keeps the host's uid
    and gets only the cgroup and the rlimits."""
    cgroup_procs: tuple[str, ...]
    """The slot cgroup's `cgroup.procs` files the child joins (empty: no cgroup here)."""
    limits: SandboxLimits
    hide_processes: bool = False
    """Mount its /proc with hidepid=invisible (only where `hidepid_available`)."""


def confine(c: Confinement, keep_fd: int) -> None:
    """Apply every layer to this process, or raise (the child then exits and the host reports it)."""
    for procs in c.cgroup_procs:
        with open(procs, "w") as f:
            f.write("0")
    libc = ctypes.CDLL(None, use_errno=True)
    if c.uid is not None:
        _namespaces(libc, c)
    mb = 1 << 20
    # The child already maps what the zygote imported (hundreds of MB of address space with torch): memory_mb is
    # what it may add on top, as it is what a sandboxed program may use.
    mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limits = [
        (resource.RLIMIT_AS, mapped + c.limits.memory_mb * mb),
        (resource.RLIMIT_NOFILE, c.limits.max_open_files),
        (resource.RLIMIT_FSIZE, c.limits.max_file_size_mb * mb),
        (resource.RLIMIT_CORE, 0),
    ]
    if c.uid is not None:
        limits.append((resource.RLIMIT_NPROC, c.limits.max_processes))
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    if c.uid is not None:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, 1 << 16)
    if c.uid is None:
        return
    os.setgroups([])
    os.setresgid(c.uid, c.uid, c.uid)
    os.setresuid(c.uid, c.uid, c.uid)  # from root to a plain uid: every capability is dropped
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.environ.clear()
    os.environ.update(PATH=SANDBOX_PATH, HOME="/tmp", TMPDIR="/tmp", LANG="C.UTF-8")


def _namespaces(libc, c: Confinement) -> None:
    flags = _CLONE_NEWNS | _CLONE_NEWIPC | (0 if c.limits.network else _CLONE_NEWNET)
    _check(libc.unshare(flags), "unshare")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    size = f"size={c.limits.disk_mb}m,nr_inodes={max(1024, 256 * c.limits.disk_mb)},mode=1777".encode()
    for where in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        _check(libc.mount(b"agentrl-sandbox", where, b"tmpfs", _MS_NOSUID | _MS_NODEV, size), f"mount {where!r}")
    if c.hide_processes:
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _check(libc.mount(b"proc", b"/proc", b"proc", flags, _HIDEPID), "mount /proc")
    os.chdir("/tmp")


@functools.cache
def hidepid_available() -> str | None:
    """None when a procfs mounted in a new mount namespace can hide other uids' processes (as root), else why not."""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        return "util-linux `unshare` or `mount` not found"
    probe = [unshare, "--mount", "--", mount, "-t", "proc", "-o", _HIDEPID.decode(), "proc", "/proc"]
    done = subprocess.run(probe, capture_output=True, text=True)
    return None if done.returncode == 0 else f"`mount -o {_HIDEPID.decode()}` of /proc failed: {done.stderr.strip()}"


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sandbox child: {what}: {os.strerror(errno)}")
