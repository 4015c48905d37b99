"""Agent programs (`env.agent`) contained like environments: a hostile program (tests/unit/hostile_agent.py) beside
well-behaved ones in the same batch, at `env.isolation=sandbox` and at `auto`, with the real endpoint, a real engine
(torch backend, the built-in tiny model) and the real `openai` client; no Ray, no mocks of the OS.

At `sandbox` the hostile program's processes (a double fork, a `setsid` escapee, one left by a program killed at its
deadline) are dead when its trajectory ends; its /tmp, /var/tmp and /dev/shm files never reach the host's; it reads
neither /etc/shadow nor a root-only session file (nor one in the host's /tmp, where Ray keeps them), nor the test's
command line; it sees no listening socket and connects to no port of the machine (the test's own listener accepts
nothing), the endpoint's TCP port included; its own endpoint answers, a sibling's key is refused. The same program
at `auto` is the control: it does read and connect there (`auto` isolates processes, limits and TMPDIR, not files
or network), while its processes still die with the trajectory and its TMPDIR is removed. The well-behaved
programs' trajectories are intact at both levels.

Run: `.venv/bin/pytest tests/unit/test_agent_isolation.py` (about 30 s on 2 busy cores). The sandbox test needs root.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from agentrl_ray.config import EnvConfig, RewardConfig, RolloutConfig
from agentrl_ray.envs.isolation.bridge import SOCKETS
from agentrl_ray.envs.isolation.sandbox_uids import live_pids
from agentrl_ray.rewards import load_reward_functions
from agentrl_ray.rollout.endpoint.agents import AgentRunner
from agentrl_ray.rollout.endpoint.server import Endpoint
from agentrl_ray.rollout.torch_engine import TorchEngine
from agentrl_ray.types import RolloutTimings

IS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.timeout(240)
CFG = RolloutConfig(backend="torch", max_turns=3, max_tokens_per_turn=48, max_total_tokens=320)
ROW = {"prompt": "What is 347 * 29?", "answer": "10063"}
AGENT = "hostile_agent:run"


@pytest.fixture(scope="module")
def engine(builtin_model_path):
    from transformers import AutoTokenizer

    model = TorchEngine(builtin_model_path, dtype="float32", seed=0, max_model_len=512, max_num_seqs=8)
    return model, AutoTokenizer.from_pretrained(builtin_model_path)


@pytest.fixture
def host():
    """What a hostile program should not reach: a TCP listener on every interface, a root-only "session" file in
    a directory anyone may enter (only its mode protects it), and one where Ray keeps them, in the host's /tmp."""
    listener = socket.create_server(("0.0.0.0", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    ips = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    marker = str(secrets.randbelow(10**9))  # also a sleeper's `sleep 3600.MARKER`
    files = []
    for top in ("/run", "/tmp"):
        session = Path(top) / f"agentrl-test-ray-{marker}" / "session_latest"
        session.mkdir(parents=True)
        session.parent.chmod(0o755)
        session.chmod(0o755)
        secret = session / "redis_password"
        secret.write_text("hunter2")
        secret.chmod(0o600)
        files.append(str(secret))
    yield {
        "listener": listener,
        "targets": sorted((ip, port) for ip in ips | {"127.0.0.1"}),
        "marker": marker,
        "secrets": files,
    }
    listener.close()
    for path in files:
        shutil.rmtree(Path(path).parents[1])


def _accepted(listener: socket.socket) -> int:
    n = 0
    while True:
        try:
            listener.accept()[0].close()
            n += 1
        except BlockingIOError:
            return n


@contextmanager
def _sleepers(marker: str):
    """The pids of every `sleep 3600.MARKER` seen while the block runs (polled: the killed program cannot say)."""
    seen, done = set(), threading.Event()

    def watch():
        while not done.wait(0.2):
            for proc in psutil.process_iter(["cmdline"]):
                if proc.info["cmdline"] == ["sleep", f"3600.{marker}"]:
                    seen.add(proc.pid)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a killed orphan is a zombie until reaped
    except psutil.NoSuchProcess:
        return False


def _batch(engine, level: str, host: dict, write_tmp: bool, caplog):
    """Four calculators and the hostile program under one runner, a hanging one (deadline 6 s) beside them; returns
    the trajectories by key, the hostile program's report and the pids of all four sleepers."""
    model, tokenizer = engine
    endpoint = Endpoint(model, tokenizer, CFG, lambda: 0)
    behaviours = {f"calculator-{i}": "calculator" for i in range(4)} | {"hostile-4": "hostile"}
    extra = {"secrets": host["secrets"], "targets": host["targets"], "marker": host["marker"], "write_tmp": write_tmp}
    extra |= {"test_pid": os.getpid(), "sockets_dir": str(SOCKETS), "victim": "calculator-0"}
    rows = [{**ROW, "id": k, "behaviour": b, **extra} for k, b in behaviours.items()]
    funcs = load_reward_functions(["answer_match"])
    cfg = EnvConfig(agent=AGENT, isolation=level, agent_timeout_s=120.0)
    runner = AgentRunner(endpoint, cfg, CFG, RewardConfig(), funcs)
    hang = AgentRunner(
        endpoint, EnvConfig(agent=AGENT, isolation=level, agent_timeout_s=6.0), CFG, RewardConfig(), funcs
    )
    hang.processes = runner.processes  # the same agent at the same level: one zygote for both deadlines

    async def main():
        port = int(urlsplit(await endpoint.start()).port)
        for row in rows:  # the endpoint's own TCP port too: at sandbox its socket is the only way there
            row["targets"] = [*host["targets"], ("127.0.0.1", port)]
        return await asyncio.gather(
            runner.rollout(rows, list(behaviours), 1.0, 0, 0, RolloutTimings()),
            hang.rollout(
                [{**rows[0], "id": "hangs-5", "behaviour": "hangs"}], ["hangs-5"], 1.0, 0, 0, RolloutTimings()
            ),
        )

    with caplog.at_level(logging.WARNING, logger="agentrl_ray"), _sleepers(host["marker"]) as sleepers:
        done, hung = asyncio.run(main())
    got = dict(zip([*behaviours, "hangs-5"], [*done, *hung]))
    errors = [r.getMessage() for r in caplog.records if r.getMessage().startswith("agent of hostile-4: ")]
    assert len(errors) == 1, caplog.text
    report = json.loads(errors[0].removeprefix("agent of hostile-4: RuntimeError: "))
    sleepers |= set(report["pids"])  # the poll may miss those of a program quicker than it
    assert len(sleepers) == 4, (report["pids"], sleepers)  # two each
    return got, report, sorted(sleepers)


def _check_the_others(got: dict) -> None:
    """The well-behaved programs' trajectories are whole; the hostile and the hanging one cost only their own."""
    good = [got[f"calculator-{i}"] for i in range(4)]
    for t in good:
        assert t.finish_reason in ("answer", "max_turns") and t.num_action_tokens > 0, (
            t.prompt_id,
            t.completion_messages,
        )
        assert "agent/error" not in t.reward_parts and t.num_steps >= 1
    assert any(m["role"] == "tool" for t in good for m in t.completion_messages)  # a loop ran: call, tool, call
    for key in ("hostile-4", "hangs-5"):
        t = got[key]
        assert (t.finish_reason, t.reward, t.reward_parts.get("agent/error")) == ("error", 0.0, 1.0), key
    assert got["hostile-4"].num_steps == 1  # its own endpoint answered its one call (the victim's key did not)


@pytest.mark.skipif(not IS_ROOT, reason="env.isolation=sandbox needs root (a uid per trajectory)")
def test_a_hostile_program_in_the_sandbox_reaches_nothing_and_leaves_nothing(engine, host, caplog):
    sockets_before = set(os.listdir(SOCKETS)) if SOCKETS.exists() else set()
    got, report, sleepers = _batch(engine, "sandbox", host, True, caplog)
    _check_the_others(got)
    uid = report["uid"]
    assert uid >= 2_000_000_000  # a leased sandbox uid, not root
    assert report["own"] == "ok" and report["victim"] == "401"  # a sibling's key is no key
    # Processes: a double fork, a setsid escapee, and those of the program killed at its deadline.
    assert [p for p in sleepers if _alive(p)] == [] and live_pids(uid) == []
    # Files: written in its own tmpfs dirs, none in the host's.
    assert report["wrote"] == ["ok"] * 3
    leftovers = [f"{d}/agentrl-hostile-{host['marker']}" for d in ("/tmp", "/var/tmp", "/dev/shm")]
    assert [p for p in [*leftovers, report["tmpdir_file"]] if os.path.exists(p)] == []
    # Secrets: /etc/shadow and the root-only session file by mode, the one in the host's /tmp is not even there,
    # the test's command line is hidden (its /proc shows its own uid's processes only); nor may it list the sockets.
    denied, missing = os.strerror(13), os.strerror(2)
    assert report["read"] == [denied, denied, missing, missing] and report["listing"] == denied
    # Network: no listening socket to see, no port to reach on any interface, the endpoint's included.
    assert report["listening"] == 0
    assert report["tcp"] == [os.strerror(101)] * (len(host["targets"]) + 1), report["tcp"]  # ENETUNREACH
    assert _accepted(host["listener"]) == 0
    assert report["memory"] == "MemoryError"
    assert set(os.listdir(SOCKETS)) <= sockets_before  # its socket is gone with it


def test_at_auto_processes_limits_and_tmpdir_are_contained(engine, host, caplog):
    got, report, sleepers = _batch(engine, "auto", host, False, caplog)
    _check_the_others(got)
    assert report["uid"] == os.geteuid() and report["own"] == "ok" and report["victim"] == "401"
    # The control: at auto it runs as the worker's user with the worker's files and network.
    assert report["tcp"] == ["ok"] * (len(host["targets"]) + 1)  # the test's listener on each interface, the endpoint
    assert _accepted(host["listener"]) == len(host["targets"])
    assert report["listening"] >= 1 and report["read"][-1] == "ok"
    # What auto does contain: its processes (the setsid escapee through the cgroup, as root), its TMPDIR, its memory.
    alive = [p for p in sleepers if _alive(p)]
    assert alive == [] if IS_ROOT else len(alive) == 2  # without root, no cgroup: the setsid escapees live on
    assert report["tmpdir_file"].startswith(os.path.join(os.environ.get("TMPDIR", "/tmp"), "agentrl-agent-"))
    assert not os.path.exists(os.path.dirname(report["tmpdir_file"]))
    assert report["memory"] == "MemoryError"
    for pid in alive:  # this test's to end
        os.kill(pid, 9)
