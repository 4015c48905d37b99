"""Run model-written code in a child process with limits. Everything that executes model code goes through here.

Threat model: the code is written by a policy under RL pressure. It is not a skilled attacker, but it will find and
use whatever the environment lets it do (loop forever, fork, allocate, flood stdout, read secrets, write where the
reward is computed, talk to the network, meddle with a sibling rollout). The sandbox contains those; it is NOT a
security boundary against a determined attacker with a kernel exploit.

How each run is built (`python -I` for code, or any argv), as measured on our 2-core Linux 6.x workers. Each layer
is probed once per process; when one is missing the run is REFUSED (an error result) unless
`SandboxLimits(require_isolation=False)`, which runs with what there is, warns once and reports the missing layers
in the result (`uid_isolated`, `namespaced`, `cgroup_limited`, `network_isolated`). Never silently weaker.
- Its own process group (`start_new_session`). The wall-clock limit is enforced from the parent by
  `os.killpg(SIGKILL)`, never `signal.alarm` (which misbehaves inside Ray actors).
- Namespaces (`unshare --mount --ipc --pid --fork --kill-child --mount-proc --net`): a launcher
  (`sandbox_init.pl`), still root inside them, joins the cgroup, mounts a fresh size-limited tmpfs (`disk_mb`,
  nosuid, nodev) on each of /tmp, /var/tmp and /dev/shm, and copies the working directory into the private /tmp.
  Consequences:
  * Nothing a run writes to /tmp, /var/tmp or /dev/shm (POSIX shared memory included) is seen by anyone else or
    outlives it: the mounts die with the namespace. Files in them count against the memory cgroup.
  * Its SysV shared memory, message queues and semaphores live in its own IPC namespace and die with it.
  * Its own PID namespace and /proc: it sees only its own processes (not the trainer's command lines or
    environment). The launcher stays as pid 1: it reaps orphans, forwards the program's exact wait status, and when
    the program exits, the kernel kills everything left in the namespace (`setsid` escapees included).
  * No network: only a downed loopback, so even 127.0.0.1 (Ray, the dashboard, vLLM servers) is unreachable
    (ENETUNREACH), unless `network=True`.
- A cgroup per uid slot (`cgroups.py`; v2 where the memory and pids controllers can be delegated, else v1):
  `total_memory_mb` bounds the run's processes together, tmpfs files included (the kernel OOM-kills inside the run;
  the result says so and reports `memory_peak_mb`), and `max_processes` + 1 bounds its tasks. Its member list makes
  the final kill exact.
- As root (our workers): the program runs under its own unprivileged uid, one per concurrent sandbox
  (`sandbox_uids.py`: `SANDBOX_UID_BASE` + a slot held with `flock`, valid across processes), via `setpriv`, with
  no supplementary groups, no capabilities (bounding set emptied) and no_new_privs (setuid binaries gain nothing):
  * RLIMIT_NPROC works. The kernel does not enforce it for uid 0, and it counts every process and thread of a
    uid, so a shared uid (e.g. `nobody`) would let sandboxes starve each other.
  * It cannot write the host's files: only its private tmpfs directories.
  * Sandboxes cannot signal or ptrace each other or the trainer. Processes of the uid still alive when the run
    ends (there should be none) are found by a /proc scan and killed.
- As non-root: no separate uid is possible here (it would need a setuid `newuidmap` and /etc/subuid ranges; not
  used), so the run is refused by default. With `require_isolation=False` it runs as the calling user in a user
  namespace (`unshare --user --map-root-user` plus the namespaces above: private tmpfs dirs, IPC, PID, network)
  and CAN write that user's files; no cgroup (not delegated); RLIMIT_NPROC counts the namespace's processes.
- rlimits set by util-linux `prlimit` right before the exec: RLIMIT_CPU (SIGXCPU at the limit, SIGKILL a second
  later), RLIMIT_AS (allocations fail: Python raises MemoryError), RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_FSIZE,
  RLIMIT_CORE=0. No `preexec_fn`: it is unsafe in a threaded parent, and env actors run sandboxes from threads.
- A scrubbed environment (PATH, HOME=TMPDIR=workdir, LANG, PYTHONDONTWRITEBYTECODE): no secrets from the parent.
- stdout/stderr are read as they come; each keeps its first `max_output_bytes`, the rest is drained and dropped.

What is NOT isolated:
- Same kernel: a kernel bug is an escape. No seccomp filter; every syscall is available.
- The host filesystem outside the temp dirs is readable wherever "others" may read: the code, the venv, /etc. Keep
  secrets in files that are not world-readable (here /root is 0700).
- CPU time is bounded per process; concurrent sandboxes compete for cores with the trainer (no cpu cgroup).
- The interpreter must be reachable by the sandbox uid. `sys.executable` of our venv lives under /root (0700), so
  as root the sandbox runs the first `python3` on `SANDBOX_PATH` (stdlib only); see `sandbox_python`.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentrl_ray.envs.isolation import cgroups
from agentrl_ray.envs.isolation.sandbox_layers import (
    Layers,
    SandboxLimits,
    SandboxResult,
    init_status,
    namespace_args,
    namespace_probe,
    warn_once,
    wrap,
)
from agentrl_ray.envs.isolation.sandbox_uids import SANDBOX_UID_BASE, kill_uid, sandbox_uid

logger = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # each replaced by the run's own tmpfs (sandbox_init.pl)
_READ_CHUNK = 1 << 16
_DRAIN_AFTER_KILL_S = 1.0


def run_python(
    code: str,
    *,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
    files: dict[str, str] | None = None,
    python: str | None = None,
) -> SandboxResult:
    """Run `code` as `main.py` in a fresh sandbox with `python -I` (isolated mode: PYTHON* variables, the user site
    and the script's directory are ignored; helper modules passed in `files` need `sys.path.insert(0, ".")`)."""
    files = dict(files or {})
    if "main.py" in files:
        raise ValueError("files may not contain 'main.py': it holds the code")
    files["main.py"] = code
    return run_command([python or sandbox_python(), "-I", "main.py"], stdin=stdin, limits=limits, files=files)


def run_command(
    argv: list[str], *, stdin: str = "", limits: SandboxLimits = SandboxLimits(), files: dict[str, str] | None = None
) -> SandboxResult:
    """Run `argv` in a fresh sandbox whose working directory holds `files` (relative path -> text)."""
    start = time.monotonic()
    layers = Layers.probe(limits.network)
    if layers.missing:
        reason = "isolation unavailable: " + "; ".join(layers.missing)
        if limits.require_isolation:
            refused = SandboxResult("", "", None, False, False, reason + " (refused to run)", 0.0)
            return layers.stamp(refused)
        warn_once(reason + "; running without (require_isolation=False)")
    with sandbox_uid() as uid, _workdir(files or {}, uid) as workdir, tempfile.TemporaryFile() as stdin_file:
        stdin_file.write(stdin.encode())
        stdin_file.seek(0)
        cgroup = cgroups.slot_cgroup(uid - SANDBOX_UID_BASE) if uid is not None and layers.cgroup else None
        oom_before = cgroup.prepare(limits.total_memory_mb << 20, limits.max_processes + 1) if cgroup else 0
        inner_dir = f"/tmp/{Path(workdir).name}" if layers.namespaced else workdir
        status_r, status_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            proc = subprocess.Popen(
                wrap(argv, limits, uid, layers, cgroup, inner_dir, status_w),
                cwd=workdir,
                env=_child_env(inner_dir),
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(status_w,) if layers.namespaced else (),  # the program itself never holds it
            )
        finally:
            os.close(status_w)
        try:
            out, err, truncated, timed_out = _collect(proc, limits, uid, cgroup)
        except BaseException:
            _kill_all(proc, uid, cgroup)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
            exit_code, reported = init_status(status_r, proc.wait())
        oom_killed = cgroup is not None and cgroup.oom_kills() > oom_before
        peak = cgroup.peak_bytes() if cgroup else None
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    error = _explain(exit_code, stderr, timed_out, limits, oom_killed)
    if layers.namespaced and not reported and not timed_out and not oom_killed and exit_code >= 0:
        error = f"the sandbox could not be set up (exit {exit_code}): {stderr.strip()[-500:]}"
    result = SandboxResult(stdout, stderr, exit_code, timed_out, truncated, error, time.monotonic() - start)
    result.memory_peak_mb = None if peak is None else peak / (1 << 20)
    return layers.stamp(result)


def network_isolation_available() -> bool:
    """Whether this process can give a sandbox its own network namespace (probed once)."""
    return namespace_probe(tuple(namespace_args(False))) is None


@functools.cache
def sandbox_python() -> str:
    """The interpreter sandboxes run: `sys.executable` when the sandbox can reach it, else `python3` on
    `SANDBOX_PATH` (which lacks this environment's packages; a warning says so). Unreachable: a venv under /root
    (0700) as root, or one under /tmp, /var/tmp or /dev/shm (a checkout cloned there), which the sandbox replaces
    with its own empty tmpfs."""
    hidden = any(Path(p).is_relative_to(d) for p in (os.path.abspath(sys.executable), sys.prefix) for d in PRIVATE_DIRS)
    if not hidden and (os.geteuid() != 0 or (_world_reachable(sys.executable) and _world_reachable(sys.base_prefix))):
        return sys.executable
    fallback = shutil.which("python3", path=SANDBOX_PATH)
    if fallback is None:
        raise RuntimeError(f"no python3 on {SANDBOX_PATH} and {sys.executable} is not reachable by other users")
    logger.warning(
        "sandbox: %s is not reachable in the sandbox (a parent directory lacks o+x, or it lies under /tmp, "
        "/var/tmp or /dev/shm, which the sandbox replaces); sandboxed Python runs %s instead, without this "
        "environment's packages",
        sys.executable,
        fallback,
    )
    return fallback


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


@contextmanager
def _workdir(files: dict[str, str], uid: int | None) -> Iterator[str]:
    """A private directory holding `files`, owned by the sandbox uid, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="agentrl-sandbox-"))
    try:
        for name, text in files.items():
            rel = Path(name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                raise ValueError(f"sandbox file names must be relative paths inside the sandbox, got {name!r}")
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if uid is not None:
            for path in [root, *root.rglob("*")]:
                os.chown(path, uid, uid)
        yield str(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- running it


def _collect(
    proc: subprocess.Popen, limits: SandboxLimits, uid: int | None, cgroup: cgroups.SlotCgroup | None
) -> tuple[bytes, bytes, bool, bool]:
    """Read both pipes, keeping the first `max_output_bytes` of each, until the run is over: the main process has
    exited (its leftovers are then killed) or the wall-clock deadline passed (everything is killed). On return
    nothing of the run is alive."""
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = timed_out = exited = False
    poller = select.poll()
    for fd in kept:
        poller.register(fd, select.POLLIN)
    pidfd = os.pidfd_open(proc.pid)
    poller.register(pidfd, select.POLLIN)
    open_fds = set(kept)
    deadline = time.monotonic() + limits.wall_time_s
    try:
        while open_fds or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if exited or timed_out:
                    break  # a pipe is held by something we cannot reach (non-root escapee)
                timed_out = exited = True
                _kill_all(proc, uid, cgroup)
                poller.unregister(pidfd)
                deadline = time.monotonic() + _DRAIN_AFTER_KILL_S  # read what is left in the pipes
                continue
            for fd, _ in poller.poll(remaining * 1000):
                if fd == pidfd:
                    exited = True
                    poller.unregister(pidfd)
                    _kill_all(proc, uid, cgroup)  # the main process is gone, so is the run
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                room = limits.max_output_bytes - len(kept[fd])
                kept[fd] += chunk[: max(room, 0)]
                truncated |= len(chunk) > room
    finally:
        os.close(pidfd)
    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), truncated, timed_out


def _kill_all(proc: subprocess.Popen, uid: int | None, cgroup: cgroups.SlotCgroup | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group id stays valid until we reap the main process
    except ProcessLookupError:
        pass
    if cgroup is not None:
        cgroup.kill_all()  # exact: every process of the run, wherever it went
    if uid is not None:
        kill_uid(uid)  # whatever left the process group


def _explain(exit_code: int, stderr: str, timed_out: bool, limits: SandboxLimits, oom_killed: bool) -> str | None:
    if timed_out:
        return f"killed: wall-clock timeout after {float(limits.wall_time_s)}s"
    if oom_killed:
        return f"killed: the run's processes together exceeded total_memory_mb={limits.total_memory_mb}"
    if exit_code == -signal.SIGXCPU:
        return f"killed: CPU time limit {limits.cpu_time_s} s"
    if exit_code != 0 and "MemoryError" in stderr[-2000:]:
        return f"memory limit {limits.memory_mb} MB exceeded (MemoryError)"
    if exit_code == -signal.SIGXFSZ:
        return f"killed: file size limit {limits.max_file_size_mb} MB"
    if exit_code < 0:
        return f"killed by signal {signal.Signals(-exit_code).name}"
    return None


def _world_reachable(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents])
