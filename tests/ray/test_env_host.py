"""EnvHost as a real Ray async actor: many trajectories, tools, timeouts, exceptions, close and stats."""

import os
import time

import pytest
import ray

from agentrl_ray.chat_format import ToolCall, parse_tool_calls
from agentrl_ray.envs.host import EnvHost, ToolResult

pytestmark = pytest.mark.integration

CALCULATOR = "agentrl_ray.envs.builtin.calculator:CalculatorEnv"


class FlakyEnv:
    """Defined here, imported by path inside the actor (the fixture puts this directory on its PYTHONPATH)."""

    def __init__(self, label: str = "") -> None:
        self.label = label

    def reset(self, **row) -> str:
        return f" [{self.label}:{row['id']}]"

    def nap(self, seconds: float) -> str:
        """Sleep, then answer.

        Args:
            seconds: How long to sleep.
        """
        time.sleep(seconds)
        return "rested"

    def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    def die(self, how: str) -> str:
        """Leave badly (only ever called at env.isolation=process).

        Args:
            how: exit, segfault or system_exit.
        """
        if how == "exit":
            os._exit(3)
        if how == "segfault":
            import ctypes

            ctypes.string_at(0)
        raise SystemExit(2)


@pytest.fixture(scope="module")
def host():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    actor = ray.remote(EnvHost).options(num_cpus=0.25, max_concurrency=100).remote(tool_timeout_s=1.0)
    yield actor
    ray.shutdown()


def test_many_trajectories_with_calculator(host):
    keys = [f"traj-{i}" for i in range(8)]
    resets = ray.get([host.create.remote(k, CALCULATOR, {}, {"id": i}) for i, k in enumerate(keys)])
    assert resets == [None] * 8
    turn = parse_tool_calls(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 / 0"}}\n</tool_call>'
        "<tool_call>\n{broken\n</tool_call>"
    )
    results = ray.get([host.call_tools.remote(k, turn.calls, turn.errors) for k in keys])
    for r in results:
        assert r[0] == ToolResult("42", False)
        assert r[1] == ToolResult("Error: calculator: division by zero", True)
        assert r[2].error and r[2].text.startswith("Error: could not parse tool call: tool call is not valid JSON")
    assert ray.get(host.env_reward.remote(keys[0], "42")) is None  # the calculator has no reward of its own
    assert ray.get([host.close.remote(k) for k in keys]) == [True] * 8
    stats = ray.get(host.stats.remote())
    assert stats["open"] == 0 and stats["created"] >= 8 and stats["parse_errors"] >= 8


def test_timeouts_do_not_block_other_trajectories_and_exceptions_are_observations(host):
    env = "test_env_host:FlakyEnv"
    before = ray.get(host.stats.remote())
    assert ray.get(host.create.remote("slow", env, {"label": "s"}, {"id": 1})) == " [s:1]"
    assert ray.get(host.create.remote("quick", env, {"label": "q"}, {"id": 2})) == " [q:2]"
    t0 = time.perf_counter()
    slow_ref = host.call_tools.remote("slow", [ToolCall("nap", {"seconds": 5})], [])
    quick = ray.get(host.call_tools.remote("quick", [ToolCall("nap", {"seconds": "0"}), ToolCall("boom", {})], []))
    quick_s = time.perf_counter() - t0
    slow = ray.get(slow_ref)
    slow_s = time.perf_counter() - t0
    assert quick == [ToolResult("rested", False), ToolResult("Error: boom: RuntimeError: kaboom", True)]
    assert quick_s < 1.0  # served while the other trajectory's tool was still sleeping
    assert slow == [ToolResult("Error: nap timed out after 1 s", True)]
    assert slow_s < 3.0  # the 5 s tool was not waited for
    assert ray.get(host.close.remote("slow")) and ray.get(host.close.remote("quick"))
    assert ray.get(host.close.remote("quick")) is False  # idempotent
    after = ray.get(host.stats.remote())
    assert after["timeouts"] - before["timeouts"] == 1
    assert after["errors"] - before["errors"] == 2
    assert after["calls"] - before["calls"] == 3
    assert after["open"] == 0


def test_create_errors_propagate(host):
    with pytest.raises(ray.exceptions.RayTaskError, match="no_such_module"):
        ray.get(host.create.remote("bad", "no_such_module:Env", {}, {}))
    with pytest.raises(ray.exceptions.RayTaskError, match="no open environment 'never'"):
        ray.get(host.call_tools.remote("never", [], []))


def test_turn_based_env_through_the_actor(host):
    from agentrl_ray.envs.host import TurnResult

    env = "examples.task_actions.env:ActionTaskEnv"
    intro = ray.get(host.create.remote("task", env, {"max_steps": 3}, {"required_actions": ["a", "b"]}))
    assert intro.startswith("\nValid actions: a, b.")
    first = ray.get(host.call_turn.remote("task", "ACTION: a"))
    second = ray.get(host.call_turn.remote("task", "ACTION: b"))
    assert first == TurnResult("done: a", 0.0, False)
    assert second == TurnResult("done: b\nTask complete.", 1.0, True)
    assert ray.get(host.env_reward.remote("task", "")) == 1.0
    assert ray.get(host.close.remote("task"))


def test_process_isolation_in_the_actor_contains_exits_crashes_and_hangs(host):
    """env.isolation=process inside a real async actor (the zygote's control socket on Ray's event loop): each
    trajectory's os._exit, segfault, SystemExit or hang costs that trajectory; the actor serves on."""
    del host  # only its Ray
    actor = ray.remote(EnvHost).options(num_cpus=0.25, max_concurrency=100).remote(1.0, isolation="process")
    env = "test_env_host:FlakyEnv"
    keys = ["exit", "segfault", "system_exit", "hang", "fine"]
    assert ray.get(actor.create_many.remote(env, {}, [(k, {"id": k}) for k in keys])) == [f" [:{k}]" for k in keys]
    naps = {"hang": 30, "fine": 0}
    calls = [
        (k, [ToolCall("nap", {"seconds": naps[k]}) if k in naps else ToolCall("die", {"how": k})], []) for k in keys
    ]
    results = dict(zip(keys, (r[0] for r in ray.get(actor.call_tools_many.remote(calls)))))
    assert "died during die: it exited with code 3" in results["exit"].text
    assert "died during die: killed by signal SIGSEGV" in results["segfault"].text
    assert results["system_exit"] == ToolResult("Error: die: SystemExit: 2", True)
    assert results["hang"] == ToolResult("Error: nap timed out after 1 s", True)
    assert results["fine"] == ToolResult("rested", False)
    ray.get(actor.close_many.remote(keys))
    assert ray.get(actor.create.remote("again", env, {}, {"id": 9})) == " [:9]"
    assert ray.get(actor.call_tools.remote("again", [ToolCall("nap", {"seconds": 0})], [])) == [ToolResult("rested")]
    assert ray.get(actor.close.remote("again"))
    stats = ray.get(actor.stats.remote())
    assert stats["open"] == 0 and stats["children_alive"] == 0 and stats["children_started"] == 6
    assert stats["children_died"] == 2 and stats["children_killed"] == 1
    ray.kill(actor)
