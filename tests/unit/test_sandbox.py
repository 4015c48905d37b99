"""The sandbox against real misbehaving programs: real subprocesses, no mocks of the OS.

Run: `.venv/bin/pytest tests/unit/test_sandbox.py` (about 15 s on 2 cores). Tests of confinement that only root can
provide (uid drop) are skipped elsewhere, with the reason.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import socket
import subprocess
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from builders import hidden_from_sandbox

from agentrl_ray.envs.isolation import sandbox_layers, sandbox_uids
from agentrl_ray.envs.isolation.sandbox import SandboxLimits, network_isolation_available, run_command, run_python

IS_ROOT = os.geteuid() == 0
pytestmark = [
    pytest.mark.timeout(60),
    # Without root there is no separate uid, so the sandbox refuses by default (require_isolation); that path is
    # tested as a real unprivileged user in test_sandbox_isolation.py.
    pytest.mark.skipif(not IS_ROOT, reason="the sandbox refuses to run without root (no separate uid)"),
]
needs_root = pytest.mark.skipif(not IS_ROOT, reason="only root can run the sandbox under its own uid")
needs_netns = pytest.mark.skipif(not network_isolation_available(), reason="no network namespace here")
REPO = Path(__file__).resolve().parents[2]


def live(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan stays a zombie until init reaps it)."""
    try:
        return re.search(r"^State:\s+Z", Path(f"/proc/{pid}/status").read_text(), re.M) is None
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_returns_output_and_exit_code():
    r = run_python("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert (r.stdout, r.stderr, r.exit_code, r.error, r.timed_out, r.truncated) == (
        "hello\n",
        "oops\n",
        3,
        None,
        False,
        False,
    )
    assert r.observation() == "hello\n[stderr]\noops\n[exit code 3]"
    assert r.network_isolated == network_isolation_available()


def test_python_runs_isolated_mode_in_a_private_workdir_that_is_removed():
    r = run_python("import os, sys\nprint(sys.flags.isolated)\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))")
    isolated, cwd, listing = r.stdout.splitlines()
    assert isolated == "1" and listing == "['main.py']"
    assert Path(cwd).name.startswith("agentrl-sandbox-") and not Path(cwd).exists()


def test_stdin_and_files():
    code = "import sys, json\nprint(sys.stdin.read().upper())\nprint(open('data/in.json').read())"
    r = run_python(code, stdin="some input", files={"data/in.json": '{"a": 1}'})
    assert r.stdout == 'SOME INPUT\n{"a": 1}\n' and r.exit_code == 0


def test_file_names_must_stay_inside_the_sandbox():
    for name in ("../escape.txt", "/etc/escape", ""):
        with pytest.raises(ValueError):
            run_python("pass", files={name: "x"})


def test_run_command():
    r = run_command(["sh", "-c", "cat; echo err >&2; exit 4"], stdin="piped")
    assert (r.stdout, r.stderr, r.exit_code) == ("piped", "err\n", 4)


def test_infinite_loop_killed_at_wall_clock_timeout():
    r = run_python("while True:\n    pass", limits=SandboxLimits(wall_time_s=1.0))
    assert r.timed_out and r.exit_code == -9
    assert r.error == "killed: wall-clock timeout after 1.0s"
    assert 1.0 <= r.duration_s < 2.5
    assert "wall-clock timeout" in r.observation()


def test_sleeping_program_is_killed_too():
    # A program that closes its pipes and sleeps burns no CPU: only the wall clock stops it.
    r = run_python("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", limits=SandboxLimits(wall_time_s=1.0))
    assert r.timed_out and r.duration_s < 2.5


def test_cpu_time_limit():
    r = run_python("while True:\n    pass", limits=SandboxLimits(wall_time_s=10.0, cpu_time_s=1))
    assert not r.timed_out and r.error == "killed: CPU time limit 1 s" and r.duration_s < 5


def test_allocating_8_gb_hits_the_memory_limit():
    r = run_python("x = bytearray(8 * 1024**3)\nprint('allocated')")
    assert r.exit_code == 1 and "allocated" not in r.stdout
    assert r.error == "memory limit 512 MB exceeded (MemoryError)"


def test_fork_bomb_is_contained_and_cleaned_up():
    bomb = textwrap.dedent(
        """
        import os
        print(os.getuid(), flush=True)
        while True:
            try:
                if os.fork() == 0:
                    print(os.getpid(), flush=True)
            except OSError:
                pass
        """
    )
    limits = SandboxLimits(wall_time_s=2.0, max_processes=16)
    r = run_python(bomb, limits=limits)
    uid, *pids = (int(p) for p in r.stdout.split())  # pids inside the run's PID namespace, where it has one
    assert r.timed_out
    assert 1 <= len(set(pids)) < limits.max_processes  # the process limit held
    if IS_ROOT:
        assert sandbox_uids.live_pids(uid) == []  # everything was killed
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    assert run_python("print('fine')").stdout == "fine\n"


@needs_root
def test_processes_that_leave_the_process_group_are_killed_when_the_run_ends():
    code = "import os, subprocess\np = subprocess.Popen(['sleep', '60'], start_new_session=True)\nprint(os.getuid())"
    r = run_python(code)
    assert r.exit_code == 0 and sandbox_uids.live_pids(int(r.stdout)) == []


@needs_netns
def test_no_network_even_to_the_parents_loopback():
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    code = textwrap.dedent(
        f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3)
            print("connected")
        except OSError as e:
            print("failed", e.errno)
        """
    )
    try:
        r = run_python(code)
        assert r.stdout.startswith("failed") and r.network_isolated
        with pytest.raises(BlockingIOError):
            server.accept()
        # Control: the same code reaches the server when the network is allowed.
        assert run_python(code, limits=SandboxLimits(network=True)).stdout == "connected\n"
    finally:
        server.close()


@needs_root
def test_cannot_write_outside_the_sandbox():
    host_dir = Path(tempfile.mkdtemp())
    host_dir.chmod(0o755)  # readable by everyone, writable by root only
    targets = [host_dir / "pwned.txt", REPO / "sandbox_pwned.txt", REPO / "agentrl_ray" / "__init__.py"]
    code = textwrap.dedent(
        f"""
        for path in {[str(t) for t in targets]!r}:
            try:
                open(path, "a").write("pwned")
                print("wrote", path)
            except OSError as e:
                print("denied", type(e).__name__)
        """
    )
    before = targets[2].read_bytes()
    try:
        r = run_python(code)
        # The host's /tmp is not even visible (the run has its own); elsewhere the uid may not write.
        expected = ["denied " + ("FileNotFoundError" if hidden_from_sandbox(t) else "PermissionError") for t in targets]
        assert r.stdout.split("\n")[:3] == expected
        assert not targets[0].exists() and not targets[1].exists() and targets[2].read_bytes() == before
    finally:
        host_dir.rmdir()


def test_parent_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    code = textwrap.dedent(
        f"""
        import os
        print(sorted(os.environ))
        try:
            print(open("/proc/{os.getpid()}/environ").read())
        except OSError as e:
            print(type(e).__name__)
        """
    )
    r = run_python(code)
    assert "AGENTRL_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert r.stdout.splitlines()[0] == "['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']"
    # The trainer is not in the run's PID namespace (its own /proc); without one, another uid may not read it.
    assert r.stdout.splitlines()[1] == ("FileNotFoundError" if r.namespaced else "PermissionError")


def test_printing_100_mb_is_truncated_quickly_in_bounded_memory():
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    r = run_python("import sys\nsys.stdout.write('x' * 100_000_000)\nsys.stderr.write('e' * 100_000)")
    assert r.exit_code == 0 and r.truncated
    assert r.stdout == "x" * 16_384 and r.stderr == "e" * 16_384
    assert r.duration_s < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 32 * 1024
    assert r.observation().endswith("[output truncated]")


def test_20_concurrent_sandboxes_do_not_interfere():
    code = (
        "import os, time\ntime.sleep(0.3)\n"
        + "print(open('mine.txt').read(), sorted(os.listdir()), os.getuid(), os.getcwd())"
    )

    def one(i: int):
        return run_python(code, files={"mine.txt": str(i)})

    t0 = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    assert time.monotonic() - t0 < 15
    fields = [r.stdout.split(" ", 3) for r in results]
    assert [r.exit_code for r in results] == [0] * 20
    assert [int(f[0]) for f in fields] == list(range(20))
    assert all(f[1] == "['main.py'," and f[2].startswith("'mine.txt']") for f in fields)
    assert len({f[3] for f in fields}) == 20  # private working directories
    if IS_ROOT:
        assert len({r.stdout.split()[-2] for r in results}) == 20  # one uid each


def test_missing_network_isolation_refuses_unless_allowed(monkeypatch, caplog):
    # Simulate a kernel without network namespaces: the real probe runs an unshare flag that does not exist.
    monkeypatch.setattr(sandbox_layers, "namespace_args", lambda network: [] if network else ["--no-such-namespace"])
    sandbox_layers.Layers.probe.cache_clear()
    try:
        refused = run_python("print('ran')")
        assert refused.exit_code is None and refused.stdout == ""
        assert "network isolation unavailable:" in refused.error and not refused.network_isolated
        assert refused.error.endswith("(refused to run)")
        with caplog.at_level(logging.WARNING, logger="agentrl_ray.envs.isolation.sandbox"):
            ran = run_python("print('ran')", limits=SandboxLimits(require_isolation=False))
        assert ran.stdout == "ran\n" and not ran.network_isolated
        assert "running without (require_isolation=False)" in caplog.text
    finally:
        sandbox_layers.Layers.probe.cache_clear()


def test_an_interpreter_under_a_private_dir_is_replaced_by_one_the_sandbox_sees(monkeypatch, caplog):
    """A checkout cloned under /tmp has its venv's python there, which the sandbox's own /tmp hides ("prlimit: failed
    to execute ...: No such file or directory", found by a clean clone under /tmp): the sandbox runs python3 from
    its PATH instead, and says so."""
    import logging
    import sys

    from agentrl_ray.envs.isolation import sandbox as sandbox_module

    monkeypatch.setattr(sys, "executable", "/tmp/clone/.venv/bin/python")
    monkeypatch.setattr(sys, "prefix", "/tmp/clone/.venv")
    sandbox_module.sandbox_python.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            chosen = sandbox_module.sandbox_python()
        assert not chosen.startswith("/tmp/") and chosen.startswith(("/usr/local/bin/", "/usr/bin/", "/bin/"))
        assert "replaces" in caplog.text
    finally:
        sandbox_module.sandbox_python.cache_clear()  # the real interpreter's choice for the other tests
