"""A hostile agent program for tests/unit/test_agent_isolation.py: what the issue saw a program do under
`env.isolation=sandbox` (processes that outlive the trajectory, files in /tmp, /etc/shadow and Ray's session files
read, connections to the machine's listening ports), done as its row says, beside a well-behaved program.

"hostile" tries everything, makes one call through its own endpoint, then raises its report (compact JSON: what
it managed, errno names for what it did not); the runner logs it as the trajectory's error. "hangs" leaves the same
two sleepers and hangs until it is killed. Every sleeper runs `sleep 3600.MARKER`, for the test to find.
Everything is imported at module level: a sandboxed child cannot import from a venv it may not read.
"""

import asyncio
import json
import os
import socket
import tempfile

import openai

from examples.openai_agent.agent import run as calculator


async def run(client, row):
    behaviour = row["behaviour"]
    if behaviour == "calculator":
        return await calculator(client, row)
    pids = [_sleeper(row["marker"], setsid=False), _sleeper(row["marker"], setsid=True)]  # the second leaves its group
    if behaviour == "hangs":
        await asyncio.sleep(3600)
    report = {"uid": os.getuid(), "pids": pids, "tmpdir_file": tempfile.mkstemp(prefix="hostile-")[1]}
    if row["write_tmp"]:  # the shared temp dirs themselves (at auto they are the host's: not written there)
        report["wrote"] = [_write(f"{d}/agentrl-hostile-{row['marker']}") for d in ("/tmp", "/var/tmp", "/dev/shm")]
    report["read"] = [_read(p) for p in ["/etc/shadow", *row["secrets"], f"/proc/{row['test_pid']}/cmdline"]]
    report["listing"] = _try(lambda: os.listdir(row["sockets_dir"]))
    report["listening"] = _listening()  # what a port scan would start from
    report["tcp"] = [_connect(host, port) for host, port in row["targets"]]
    report["memory"] = _try(lambda: bytearray(3 << 30))  # 3 GiB, over the rlimit at every level
    victim = client.with_options(api_key=row["victim"])  # the well-behaved trajectory's key, as the worker names it
    report["victim"] = await _call(victim)
    report["own"] = await _call(client)
    raise RuntimeError(json.dumps(report, separators=(",", ":")))


def _sleeper(marker: str, setsid: bool) -> int:
    """Fork twice and exec a long sleep in the grandchild, orphaned at once; returns its pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            if setsid:
                os.setsid()
            os.write(w, str(os.getpid()).encode())
            os.execv("/bin/sleep", ["sleep", f"3600.{marker}"])
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    sleeper = int(os.read(r, 32))
    os.close(r)
    return sleeper


def _try(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno) if e.errno else type(e).__name__
    except Exception as e:  # noqa: BLE001 - MemoryError and the like, reported by name
        return type(e).__name__


def _write(path: str) -> str:
    def write():
        with open(path, "w") as f:
            f.write("left behind")

    return _try(write)


def _read(path: str) -> str:
    def read():
        with open(path, "rb") as f:
            f.read()

    return _try(read)


def _listening() -> int:
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                count += sum(line.split()[3] == "0A" for line in f.readlines()[1:])  # 0A: TCP_LISTEN
        except OSError:
            pass
    return count


def _connect(host: str, port: int) -> str:
    def connect():  # no name lookup (create_connection's getaddrinfo imports the idna codec, which may be unreadable)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.settimeout(2)
            s.connect((host, port))

    return _try(connect)


async def _call(client) -> str:
    try:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        return "ok"
    except openai.APIStatusError as e:
        return str(e.status_code)
    except openai.APIConnectionError as e:
        return type(e).__name__
