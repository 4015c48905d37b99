"""Hostile environments at each `env.isolation` level: whatever a tool, the constructor, `reset`, `step`, the
reward or `close` does, it costs only its own trajectory, the host keeps serving, and threads and processes stay
bounded. The real EnvHost, driven in-process (no Ray): the isolation layer is what is under test.

Each scenario opens one hostile trajectory next to a benign one on the same host; the hostile one gets an error
observation naming what happened, the benign one's calls answer as usual, and afterwards nothing is left open,
alive or stuck.
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import sys
import threading
import time

import pytest

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.host import EnvHost

HOSTILE = f"{__name__}:HostileEnv"
TURNS = f"{__name__}:HostileTurns"
PROCESS_LEVELS = ["process"] + (["sandbox"] if os.geteuid() == 0 else [])
TEST_PID = os.getpid()


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


class Custom(BaseException):
    pass


class Opaque:
    def __str__(self):
        raise RuntimeError("cannot print me")

    __repr__ = __str__


def misbehave(how: str):
    """Do the hostile thing `how`; returns a value for the 'returns' cases."""
    if how == "system_exit":
        sys.exit(2)
    if how == "keyboard_interrupt":
        raise KeyboardInterrupt
    if how == "base_exception":
        raise Custom("custom base exception")
    if how == "unprintable":
        raise Unprintable
    if how == "os_exit":
        os._exit(3)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "hang":
        # A child process hangs for good (it is killed); a thread cannot be killed, and this test process would
        # wait for it at exit, so in-process it hangs only well past the deadline.
        time.sleep(3600 if os.getpid() != TEST_PID else 3.0)
    if how == "huge":
        return "x" * 5_000_000  # over the 4 MiB bound of a child's answer, were it not cut first
    if how == "opaque":
        return Opaque()
    if how == "print":
        sys.stdout.write("spam " * 400_000)  # 2 MB to the process's stdout
        return "printed"
    return "fine"


class HostileEnv:
    def __init__(self, on: str = "", how: str = ""):
        self.on, self.how = on, how
        if on == "init":
            misbehave(how)

    def reset(self, **row):
        if self.on == "reset":
            misbehave(self.how)
        return None

    def act(self, n: int) -> str:
        """Do something.

        Args:
            n: A number.
        """
        if self.on == "tool":
            return misbehave(self.how)
        return f"ok {n}"

    def reward(self, completion: str) -> float:
        if self.on == "reward":
            misbehave(self.how)
        return 1.0

    def close(self):
        if self.on == "close":
            misbehave(self.how)


class HostileTurns:
    def __init__(self, how: str = ""):
        self.how = how

    def reset(self, **row):
        return None

    def step(self, text: str):
        misbehave(self.how)
        return "next", 0.0, False


ALWAYS = ["system_exit", "keyboard_interrupt", "base_exception", "unprintable", "hang"]
CRASHES = ["os_exit", "segfault"]  # only a child process can contain these


def cases(level: str) -> list[str]:
    return ALWAYS + (CRASHES if level != "thread" else [])


async def _scenario(host: EnvHost, n: int, on: str, how: str):
    """One hostile trajectory next to a benign one, then a fresh one; returns their answers and the host's stats
    counters for this scenario alone."""
    before = host.stats()
    bad, good, after = f"bad{n}", f"good{n}", f"after{n}"
    await host.create(good, HOSTILE, {}, {"id": good})
    await host.create(bad, HOSTILE, {"on": on, "how": how}, {"id": bad})
    bad_out = await host.call_tools(bad, [ToolCall("act", {"n": 1})], [])
    good_out = await host.call_tools(good, [ToolCall("act", {"n": 2})], [])
    rewards = [await host.env_reward(k, "done") for k in (bad, good)]
    closed = [await host.close(k) for k in (bad, good)]
    await host.create(after, HOSTILE, {}, {"id": after})  # the host still serves a new trajectory
    after_out = await host.call_tools(after, [ToolCall("act", {"n": 3})], [])
    await host.close(after)
    stats = host.stats()
    delta = {k: v - before[k] for k, v in stats.items() if k not in ("open", "children_alive", "stuck_threads")}
    delta.update(open=stats["open"], children_alive=stats["children_alive"])
    return bad_out[0], good_out[0], rewards, closed, after_out[0], delta


def _run_all(level: str, scenarios: list[tuple[str, str]], timeout: float = 1.5):
    """Every (on, how) scenario on one host (one zygote start per level, not per scenario). The deadline leaves a
    benign call in a sandboxed child room on a loaded 2-core machine (0.5 s once timed one out there)."""

    async def main():
        host = EnvHost(tool_timeout_s=timeout, isolation=level, max_threads=4)
        return {(on, how): await _scenario(host, i, on, how) for i, (on, how) in enumerate(scenarios)}

    return asyncio.run(main())


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
@pytest.mark.parametrize("level", ["thread", *PROCESS_LEVELS])
def test_whatever_an_environment_does_costs_only_its_trajectory(level):
    scenarios = [
        (on, how)
        for on in ("init", "reset", "tool", "reward", "close")
        for how in cases(level)
        # a hang at `thread` leaves a sleeping thread behind: one (in a tool) here, the bound is tested below
        if not (level == "thread" and how == "hang" and on != "tool")
    ]
    for (on, how), (bad, good, rewards, closed, after, stats) in _run_all(level, scenarios).items():
        where = f"{level}/{on}/{how}"
        assert good.text == "ok 2" and not good.error, where
        assert after.text == "ok 3" and not after.error, where
        assert rewards[1] == 1.0, where
        assert closed == [True, True], where
        assert stats["open"] == 0 and stats["children_alive"] == 0, where
        if on in ("init", "reset"):
            assert bad.error and "could not start" in bad.text, (where, bad.text)
            assert math.isnan(rewards[0]) and stats["start_errors"] == 1, where
        elif on == "tool":
            assert bad.error and bad.text.startswith("Error: act"), (where, bad.text)
            assert (stats["timeouts"] == 1) == (how == "hang"), where
        elif on == "reward":
            assert bad.text == "ok 1" and math.isnan(rewards[0]) and stats["reward_errors"] == 1, where
        else:
            assert bad.text == "ok 1" and stats["close_errors"] == 1, where


@pytest.mark.parametrize("level", PROCESS_LEVELS)
def test_the_error_observation_says_how_the_process_ended(level):
    expected = {
        "system_exit": "SystemExit: 2",
        "keyboard_interrupt": "KeyboardInterrupt",
        "base_exception": "Custom: custom base exception",
        "unprintable": "Unprintable: <message could not be printed>",
        "os_exit": "exited with code 3",
        "segfault": "killed by signal SIGSEGV",
        "hang": "timed out after 1.5 s",
    }
    out = _run_all(level, [("tool", how) for how in expected])
    for how, text in expected.items():
        bad = out[("tool", how)][0]
        assert text in bad.text, (how, bad.text)


@pytest.mark.parametrize("level", ["thread", *PROCESS_LEVELS])
def test_huge_unprintable_and_noisy_returns_become_bounded_observations(level):
    async def main():
        host = EnvHost(tool_timeout_s=5.0, isolation=level, max_output_chars=100)
        out = {}
        for how in ("huge", "opaque", "print"):
            await host.create(how, HOSTILE, {"on": "tool", "how": how}, {})
            out[how] = (await host.call_tools(how, [ToolCall("act", {"n": 1})], []))[0]
            await host.close(how)
        return out, host.stats()

    out, stats = asyncio.run(main())
    assert not out["huge"].error and out["huge"].text.startswith("x" * 100)
    assert "[truncated 4999900 characters]" in out["huge"].text and len(out["huge"].text) < 200
    assert out["opaque"].error and "cannot print me" in out["opaque"].text
    assert out["print"].text == "printed"
    assert stats["open"] == 0 and stats["children_alive"] == 0


@pytest.mark.parametrize("level", ["thread", *PROCESS_LEVELS])
def test_a_turn_based_step_that_misbehaves_ends_only_its_episode(level):
    async def main():
        host = EnvHost(tool_timeout_s=1.0, isolation=level)
        results = []
        for how in cases(level):
            if level == "thread" and how == "hang":
                continue
            await host.create(how, TURNS, {"how": how}, {})
            results.append((how, await host.call_turn(how, "hello")))
            await host.close(how)
        return results, host.stats()

    results, stats = asyncio.run(main())
    for how, turn in results:
        assert turn.error and turn.done and turn.observation.startswith("Error: step"), (how, turn)
    assert stats["open"] == 0 and stats["children_alive"] == 0


def test_hung_thread_calls_are_bounded_and_reported():
    """At `thread`, a call past its deadline cannot be stopped: it keeps its thread. Such threads are counted, and
    once all of them are stuck a call fails at once with an error that says so, instead of queueing forever."""

    async def main():
        host = EnvHost(tool_timeout_s=0.3, isolation="thread", max_threads=2)
        for k in ("a", "b", "c"):
            await host.create(k, f"{__name__}:Napper", {}, {})
        hung = await asyncio.gather(*(host.call_tools(k, [ToolCall("nap", {"s": 2.0})], []) for k in ("a", "b")))
        stuck = host.stats()["stuck_threads"]
        t0 = time.monotonic()
        refused = await host.call_tools("c", [ToolCall("nap", {"s": 0.0})], [])
        refused_after = time.monotonic() - t0
        await asyncio.sleep(2.0)  # the naps return: their threads are free again
        served = await host.call_tools("c", [ToolCall("nap", {"s": 0.0})], [])
        return hung, stuck, refused, refused_after, served, host.stats()

    hung, stuck, refused, refused_after, served, stats = asyncio.run(main())
    assert all("timed out after 0.3 s" in h[0].text for h in hung) and stuck == 2
    assert refused[0].error and "all 2 environment threads of this env host are stuck" in refused[0].text
    assert refused_after < 0.3  # refused at once, not after waiting for a thread
    assert served[0].text == "rested" and stats["stuck_threads"] == 0


class Napper:
    def reset(self, **row):
        return None

    def nap(self, s: float) -> str:
        """Sleep.

        Args:
            s: Seconds.
        """
        time.sleep(s)
        return "rested"


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
@pytest.mark.parametrize("level", PROCESS_LEVELS)
def test_a_hung_call_kills_its_process_and_the_host_stays_bounded(level):
    """32 trajectories whose tool hangs: each is killed at its deadline; no process or thread is left."""

    async def main():
        host = EnvHost(tool_timeout_s=3.0, isolation=level)  # 32 starts at once on 2 cores need their time
        keys = [f"k{i}" for i in range(32)]
        await asyncio.gather(*(host.create(k, HOSTILE, {"on": "tool", "how": "hang"}, {}) for k in keys))
        alive = host.stats()["children_alive"]
        results = await asyncio.gather(*(host.call_tools(k, [ToolCall("act", {"n": 1})], []) for k in keys))
        await asyncio.gather(*(host.close(k) for k in keys))
        return alive, results, host.stats()

    threads_before, python_threads_before = _threads(), set(threading.enumerate())
    alive, results, stats = asyncio.run(main())
    assert alive == 32 and all(r[0].error and "timed out" in r[0].text for r in results)
    assert stats["children_alive"] == 0 and stats["children_killed"] == 32 and stats["stuck_threads"] == 0
    assert not set(threading.enumerate()) - python_threads_before
    assert _threads_settled(threads_before + 1) <= threads_before + 1


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _threads_settled(limit: int, wait_s: float = 5.0) -> int:
    """The process's thread count once it is at most `limit`, or after `wait_s`. A joined thread (the event loop's
    executor joins its threads at shutdown) can stay listed in /proc for a moment after join returns, longer on
    busy cores: that is an exit not yet reaped, not a thread left behind."""
    deadline = time.monotonic() + wait_s
    while _threads() > limit and time.monotonic() < deadline:
        time.sleep(0.05)
    return _threads()


class Litterbug:
    def reset(self, **row):
        return None

    def litter(self) -> str:
        """Leave files, shared memory, SysV IPC objects and a background process behind; fill the disk.

        Returns what it saw, as JSON.
        """
        import json
        import subprocess

        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            for i in range(20):
                with open(f"{d}/litter-{os.getpid()}-{i}", "w") as f:
                    f.write("x" * 1000)
        made = [subprocess.run(["ipcmk", flag], capture_output=True).returncode for flag in ("-M 4096", "-Q", "-S 1")]
        subprocess.Popen(["sleep", "600"], start_new_session=True)
        written = 0
        try:
            with open("/tmp/fill", "wb") as f:
                for _ in range(200):  # 200 MB, far over the tmpfs
                    f.write(b"\0" * (1 << 20))
                    written += 1
        except OSError as e:
            error = e.strerror
        return json.dumps({"uid": os.getuid(), "ipcmk": made, "filled_mb": written, "error": error})


@pytest.mark.skipif(os.geteuid() != 0, reason="env.isolation=sandbox runs only as root (a uid per trajectory)")
def test_a_sandboxed_environment_leaves_nothing_of_its_uid_behind_and_stays_in_its_disk_bound():
    import json
    import subprocess

    from agentrl_ray.envs.isolation.sandbox import SandboxLimits
    from agentrl_ray.envs.isolation.sandbox_uids import live_pids

    async def main():
        host = EnvHost(tool_timeout_s=20.0, isolation="sandbox", sandbox=SandboxLimits(disk_mb=16))
        seen = []
        for k in ("a", "b"):  # twice: the second trajectory may get the same uid back
            await host.create(k, f"{__name__}:Litterbug", {}, {})
            seen.append(json.loads((await host.call_tools(k, [ToolCall("litter", {})], []))[0].text))
            await host.close(k)
        return seen

    for seen in asyncio.run(main()):
        uid = seen["uid"]
        assert uid >= 2_000_000_000 and seen["ipcmk"] == [0, 0, 0]
        assert seen["error"] == "No space left on device" and seen["filled_mb"] < 16
        assert live_pids(uid) == []
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            owned = [p for p in os.listdir(d) if _owner(os.path.join(d, p)) == uid]
            assert owned == [], (d, owned)
        ipcs = subprocess.run(["ipcs", "-a", "-c"], capture_output=True, text=True).stdout
        assert str(uid) not in ipcs


def _owner(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return None


def test_env_kwargs_too_large_for_a_child_are_the_configs_error_not_a_trajectorys():
    from agentrl_ray.envs.isolation.levels import EnvSetupError

    async def main():
        host = EnvHost(isolation="process")
        with pytest.raises(EnvSetupError, match=r"env.kwargs are too large .* pass a path to the data instead"):
            await host.create("a", HOSTILE, {"on": "x" * 1_000_000}, {})
        await host.create("b", HOSTILE, {}, {})  # the zygote still serves
        out = await host.call_tools("b", [ToolCall("act", {"n": 1})], [])
        await host.close("b")
        return out, host.stats()

    out, stats = asyncio.run(main())
    assert out[0].text == "ok 1" and stats["open"] == 0 and stats["children_alive"] == 0


def test_auto_runs_the_packages_own_environments_in_threads_and_any_other_in_a_child():
    async def main():
        host = EnvHost(isolation="auto")
        await host.create("ours", "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {}, {})
        ours = host.stats()["children_started"]
        await host.create("theirs", HOSTILE, {"on": "tool", "how": "os_exit"}, {})
        out = await host.call_tools("theirs", [ToolCall("act", {"n": 1})], [])
        await host.close("ours")
        await host.close("theirs")
        return ours, out, host.stats()

    ours, out, stats = asyncio.run(main())
    assert ours == 0 and stats["children_started"] == 1
    assert "exited with code 3" in out[0].text  # contained: this process is still here to say so
