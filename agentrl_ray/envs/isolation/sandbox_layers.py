"""The layers a sandboxed run is given and the command line that stacks them (`sandbox.py` runs it): unshare
(namespaces) → sandbox_init.pl (cgroup, private tmpfs dirs, the PID namespace's init) → setpriv (its own uid) →
prlimit (rlimits) → the program. Which layers this process can give is probed once (`Layers.probe`)."""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agentrl_ray.envs.isolation import cgroups

logger = logging.getLogger("agentrl_ray.envs.isolation.sandbox")


@dataclass
class SandboxLimits:
    wall_time_s: float = 10.0
    """Wall-clock limit of a run, from its start (the parent kills everything at the deadline)."""
    cpu_time_s: int = 10
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address space per process (RLIMIT_AS)."""
    total_memory_mb: int = 1024
    """Memory of all of a run's processes together, files in its tmpfs included (a memory cgroup)."""
    max_processes: int = 32
    """Processes and threads of a run together (RLIMIT_NPROC under its own uid, and a pids cgroup)."""
    max_open_files: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_size_mb: int = 16
    """Largest file a process may write (RLIMIT_FSIZE)."""
    disk_mb: int = 64
    """Size of each private tmpfs: /tmp (which holds the working directory), /var/tmp and /dev/shm."""
    max_output_bytes: int = 16_384
    """Output kept per stream (stdout, stderr); the rest is drained and dropped."""
    network: bool = False
    """Give the run the host's network (otherwise: its own network namespace with a downed loopback)."""
    require_isolation: bool = True
    """Refuse to run (an error result, exit_code None) when a layer is unavailable here: an own uid, the mount,
    IPC and PID namespaces, the cgroup, or (unless `network`) the network namespace. False runs with what there is,
    logs a warning once and reports the missing layers in the result."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal; None: never ran
    timed_out: bool
    truncated: bool
    error: str | None  # why the run was killed or refused, for humans and for the model
    duration_s: float
    network_isolated: bool = True
    uid_isolated: bool = True
    """Ran under its own unprivileged uid (not the trainer's)."""
    namespaced: bool = True
    """Had its own tmpfs /tmp, /var/tmp, /dev/shm and its own SysV IPC and process table."""
    cgroup_limited: bool = True
    """Its processes together were bounded by `total_memory_mb` and `max_processes` (a cgroup)."""
    memory_peak_mb: float | None = None
    """Peak memory of the run's cgroup (processes and tmpfs files), where the kernel reports it."""

    def observation(self) -> str:
        """What the model sees: the output, then what went wrong."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.truncated:
            parts.append("[output truncated]")
        if self.error:
            parts.append(f"[error] {self.error}")
        elif self.exit_code:
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) or "[no output]"


def namespace_args(network: bool) -> list[str]:
    args = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return args if network else [*args, "--net"]


@functools.cache
def namespace_probe(args: tuple[str, ...], mount_tmpfs: bool = False) -> str | None:
    """None when `unshare ARGS true` (or a tmpfs mount on /tmp in them) works here, else why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "util-linux `unshare` not found"
    probe = ["mount", "-t", "tmpfs", "-o", "size=1m", "agentrl-sandbox-probe", "/tmp"] if mount_tmpfs else ["true"]
    done = subprocess.run([unshare, *args, "--", *probe], capture_output=True, text=True)
    return None if done.returncode == 0 else f"`unshare {' '.join(args)}` failed: {done.stderr.strip()}"


_INIT = Path(__file__).with_name("sandbox_init.pl")  # the namespace's launcher and init: read it for why
_MOUNT_SYSCALL = {"x86_64": 165, "aarch64": 40}.get(os.uname().machine, 0)  # 0: the init runs `mount` instead
_PRIVATE_NS = ("--mount", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc")


@dataclass(frozen=True)
class Layers:
    """Which isolation layers this process can give a run, and why the others are missing (probed once)."""

    uid: bool
    namespaced: bool
    cgroup: bool
    isolate_net: bool
    missing: tuple[str, ...]

    @staticmethod
    @functools.cache
    def probe(network: bool) -> Layers:
        missing = []
        uid = os.geteuid() == 0
        if not uid:
            missing.append("not root: no separate uid for sandboxed code (it would run as this user)")
        ns_problem = namespace_probe((*namespace_args(True), *_PRIVATE_NS), mount_tmpfs=True)
        if ns_problem:
            missing.append(f"no private /tmp, IPC and PID namespaces: {ns_problem}")
        cg_problem = cgroups.unavailable_reason()
        if cg_problem:
            missing.append(f"no cgroup: {cg_problem}")
        net_problem = None if network else namespace_probe(tuple(namespace_args(False)))
        if net_problem:
            missing.append(f"network isolation unavailable: {net_problem}")
        isolate_net = not network and net_problem is None
        return Layers(uid, ns_problem is None, cg_problem is None, isolate_net, tuple(missing))

    def stamp(self, result: SandboxResult) -> SandboxResult:
        result.network_isolated, result.uid_isolated = self.isolate_net, self.uid
        result.namespaced, result.cgroup_limited = self.namespaced, self.cgroup
        return result


def wrap(
    argv: list[str], limits: SandboxLimits, uid: int | None, layers: Layers, cgroup, workdir: str, status_fd: int
) -> list[str]:
    """unshare (namespaces) -> sandbox_init.pl (as root in them: join the cgroup, mount the tmpfs dirs, copy the
    work dir in; then the PID namespace's init) -> setpriv (uid drop, as root) -> prlimit (rlimits) -> argv. Each
    but the init execs the next."""
    cmd: list[str] = []
    ns = [*namespace_args(network=not layers.isolate_net), *(_PRIVATE_NS if layers.namespaced else ())]
    if ns and namespace_probe(tuple(namespace_args(network=not layers.isolate_net))) is None:
        cmd += [shutil.which("unshare"), *ns, "--"]
    procs = [str(f) for f in (cgroup.procs_files() if cgroup else [])]
    if layers.namespaced:
        size = f"size={limits.disk_mb}m,nr_inodes={max(1024, 256 * limits.disk_mb)},mode=1777"
        cmd += [require("perl"), str(_INIT), str(status_fd), str(_MOUNT_SYSCALL), size, workdir, *procs, "--"]
    elif procs:  # no namespaces (require_isolation=False): only join the cgroup
        joins = [f"echo 0 > {shlex.quote(f)}" for f in procs]
        cmd += [require("sh"), "-ec", "\n".join([*joins, 'exec "$@"']), "sh"]
    if uid is not None:
        cmd += [require("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        cmd += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    mb = 1 << 20
    cmd += [require("prlimit"), f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + 1}", f"--as={limits.memory_mb * mb}"]
    cmd += [f"--nofile={limits.max_open_files}", f"--fsize={limits.max_file_size_mb * mb}", "--core=0"]
    # RLIMIT_NPROC counts a uid's processes: ours alone under a leased uid (root) or inside a user namespace.
    if uid is not None or (cmd and cmd[0] == shutil.which("unshare")):
        cmd.append(f"--nproc={limits.max_processes}")
    else:
        warn_once("no user namespace: the process limit is not enforced")
    return [*cmd, "--", *argv]


def init_status(status_r: int, launcher_status: int) -> tuple[int, bool]:
    """The program's exit code (negative: its signal) as the namespace's init saw it, and True; else the launcher's
    own and False (no PID namespace, everything was killed first, or the setup failed). Closes `status_r`."""
    try:
        raw = os.read(status_r, 64)
    except BlockingIOError:
        raw = b""
    finally:
        os.close(status_r)
    if raw.strip().isdigit():
        return os.waitstatus_to_exitcode(int(raw)), True
    return launcher_status, False


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise RuntimeError(f"the sandbox needs util-linux `{tool}`, which is not on PATH")
    return path


@functools.cache
def warn_once(message: str) -> None:
    logger.warning("sandbox: %s", message)
