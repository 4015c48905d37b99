"""The sandbox's per-run isolation layers against hostile programs: private temp dirs and SysV IPC, the aggregate
memory and disk bounds, and the non-root path run as a real unprivileged user. Real subprocesses, no mocks.

Run: `python -m pytest tests/unit/test_sandbox_isolation.py` (about 15 s on 2 cores). Needs root (to drop to a
sandbox uid, mount tmpfs and write cgroups); elsewhere each test is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from agentrl_ray.envs.isolation import sandbox
from agentrl_ray.envs.isolation.sandbox import SandboxLimits, run_python

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="the isolation layers are built by root (see test_as_non_root)"),
]
REPO = Path(__file__).resolve().parents[2]
UNPRIVILEGED_UID = 1_999_999_000  # not a sandbox uid, not a login user: the "trainer" of the non-root test
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def owned_by(uid: int) -> list[str]:
    """Every file under the shared temp dirs whose owner is `uid`."""
    found = []
    for top in SHARED_DIRS:
        for root, dirs, files in os.walk(top, onerror=lambda e: None):
            for name in dirs + files:
                path = os.path.join(root, name)
                try:
                    if os.lstat(path).st_uid == uid:
                        found.append(path)
                except FileNotFoundError:
                    pass
    return found


def sysv_ipc_of(uid: int) -> list[str]:
    """SysV shared memory segments, message queues and semaphores (host namespace) whose owner is `uid`."""
    found = []
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        uid_col = lines[0].split().index("uid")
        found += [f"{kind}: {line}" for line in lines[1:] if int(line.split()[uid_col]) == uid]
    return found


HOSTILE = textwrap.dedent(
    """
    import os, subprocess
    print(os.getuid())
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        for i in range(20):
            with open(f"{d}/leftover-{i}", "wb") as f:
                f.write(b"x" * 100_000)
        os.mkdir(f"{d}/leftover-dir")
    for flag in ("-M", "-Q", "-S"):  # a SysV shared memory segment, message queue, semaphore set
        subprocess.run(["ipcmk", flag, "4096" if flag == "-M" else "1"], check=True, capture_output=True)
    print(sorted(os.listdir("/tmp")) != [], len(os.listdir("/dev/shm")), len(os.listdir("/var/tmp")))
    print(subprocess.run(["ipcs"], capture_output=True, text=True).stdout.count("0x"))
    """
)


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_hostile_program_leaves_nothing_in_temp_dirs_or_sysv_ipc():
    for _ in range(2):  # twice: the second run could see the first run's leftovers (same uid slot possible)
        r = run_python(HOSTILE)
        assert r.exit_code == 0, r.observation()
        uid, made, ipc = r.stdout.splitlines()
        assert made == "True 21 21" and ipc == "3"  # it really wrote there and created 3 IPC objects
        assert r.namespaced and r.uid_isolated and r.cgroup_limited
        assert owned_by(int(uid)) == []
        assert sysv_ipc_of(int(uid)) == []


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_many_processes_together_stay_under_the_memory_cgroup():
    # 4 children of 120 MB each: every one is under RLIMIT_AS (512 MB), together they are over 300 MB.
    code = textwrap.dedent(
        """
        import subprocess, sys
        child = "b = bytearray(b'x') * (120 << 20); import time; time.sleep(1.5); print('ok')"
        procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(4)]
        print([p.wait() for p in procs])
        """
    )
    bounded = run_python(code, limits=SandboxLimits(total_memory_mb=300, wall_time_s=30))
    assert bounded.cgroup_limited and bounded.memory_peak_mb is not None
    assert bounded.memory_peak_mb <= 300
    assert "-9" in bounded.stdout and bounded.stdout.count("ok") < 4, bounded.observation()
    # Control: with room for all of them, all four finish, so the bound is what killed them above.
    roomy = run_python(code, limits=SandboxLimits(total_memory_mb=1024, wall_time_s=30))
    assert roomy.stdout.count("ok") == 4 and roomy.memory_peak_mb > 300, roomy.observation()


def test_a_program_killed_by_the_memory_cgroup_is_told_so():
    # The main process itself grows past the aggregate bound (RLIMIT_AS is raised above it).
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(b'x') * (16 << 20))"
    r = run_python(code, limits=SandboxLimits(total_memory_mb=128, memory_mb=1024, wall_time_s=30))
    assert r.exit_code == -9 and r.memory_peak_mb <= 128
    assert r.error == "killed: the run's processes together exceeded total_memory_mb=128"


def test_filling_the_disk_stops_at_the_tmpfs_size():
    code = textwrap.dedent(
        """
        import errno, os
        for d in (".", "/tmp", "/var/tmp", "/dev/shm"):
            written, i = 0, 0
            try:
                while True:  # 4 MB files (each under RLIMIT_FSIZE) until the tmpfs is full
                    with open(f"{d}/fill-{i}", "wb") as f:
                        for _ in range(4):
                            f.write(b"x" * (1 << 20))
                            f.flush()
                            written += 1 << 20
                    i += 1
            except OSError as e:
                print(d, written >> 20, errno.errorcode[e.errno])
        """
    )
    r = run_python(code, limits=SandboxLimits(disk_mb=24, wall_time_s=30))
    assert r.exit_code == 0, r.observation()
    lines = [line.split() for line in r.stdout.splitlines()]
    assert [line[0] for line in lines] == [".", "/tmp", "/var/tmp", "/dev/shm"]
    assert all(line[2] == "ENOSPC" for line in lines)
    # The work dir is in /tmp: together they fill one 24 MB tmpfs; /var/tmp and /dev/shm have 24 MB each.
    assert int(lines[0][1]) + int(lines[1][1]) <= 24 and int(lines[2][1]) <= 24 and int(lines[3][1]) <= 24
    assert int(lines[0][1]) >= 16  # it did fill most of it


DRIVER = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from agentrl_ray.envs.isolation.sandbox import SandboxLimits, run_python
    code = "import os\\nopen('/tmp/left-by-sandbox', 'w').write('x')\\nprint(os.getuid())"
    refused = run_python(code)
    ran = run_python(code, limits=SandboxLimits(require_isolation=False))
    out = {"uid": os.getuid(), "refused": [refused.exit_code, refused.error], "ran": [ran.exit_code, ran.stdout],
           "layers": [ran.uid_isolated, ran.namespaced, ran.cgroup_limited, ran.network_isolated]}
    print(json.dumps(out))
    """
)


def test_as_non_root_it_refuses_by_default_and_never_runs_weaker_silently():
    # A real unprivileged user runs a small driver with the system Python (our venv is under /root, 0700): only
    # the sandbox's stdlib-only modules are copied for it, into a directory that user can read.
    tmp_path = Path(tempfile.mkdtemp(prefix="agentrl-nonroot-test-"))
    try:
        _run_as_non_root(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _run_as_non_root(tmp_path: Path) -> None:
    package = tmp_path / "agentrl_ray" / "envs" / "isolation"
    package.mkdir(parents=True)
    for name in ("agentrl_ray/__init__.py", "agentrl_ray/envs/__init__.py", "agentrl_ray/envs/isolation/__init__.py"):
        (tmp_path / name).write_text("")
    for name in ("sandbox.py", "sandbox_layers.py", "sandbox_uids.py", "sandbox_init.pl", "cgroups.py"):
        shutil.copy(REPO / "agentrl_ray" / "envs" / "isolation" / name, package / name)
    (tmp_path / "driver.py").write_text(DRIVER)
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755)
    uid = UNPRIVILEGED_UID
    done = subprocess.run(
        [shutil.which("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        + [sandbox.sandbox_python(), "-I", str(tmp_path / "driver.py")],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env={"PATH": sandbox.SANDBOX_PATH, "HOME": str(tmp_path), "LANG": "C.UTF-8"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["uid"] == uid
    code, error = out["refused"]
    assert code is None and "not root: no separate uid" in error and error.endswith("(refused to run)")
    # Allowed to run weaker: it runs as this user (reported), in its own namespaces, without a cgroup (reported).
    assert out["ran"] == [0, "0\n"]  # uid 0 inside the user namespace = the calling user outside
    assert out["layers"] == [False, True, False, True]
    assert "not root: no separate uid" in done.stderr  # the warning that it ran weaker
    assert owned_by(uid) == []  # its /tmp was private: nothing left behind
