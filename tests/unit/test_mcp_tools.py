"""MCP tool servers as tools (`env.mcp_servers`, agentrl_ray/envs/adapters/mcp_tools.py), with real servers: the
`mcp` SDK's own MCPServer started as a stdio subprocess, reached through the real EnvHost."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.config import ConfigError
from agentrl_ray.config.rollout import EnvConfig
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.envs.loading import env_class
from agentrl_ray.envs.tools import tool_schemas

ROOT = Path(__file__).resolve().parents[2]
COUNTER = str(Path(__file__).with_name("mcp_counter_server.py"))


def specs(*entries: dict) -> tuple[str, ...]:
    return EnvConfig(name="", mcp_servers=list(entries)).tool_specs()


def servers_alive(marker: str) -> int:
    """Processes whose command line names `marker` (the MCP servers this test started)."""
    alive = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            alive += any(marker in part for part in p.info["cmdline"] or [])
        except psutil.Error:
            continue
    return alive


def test_the_example_servers_calculator_is_the_built_in_calculator_to_the_model(monkeypatch):
    """examples/mcp_calculator: list_tools gives the schema CalculatorEnv's method gives (the prompt is the same),
    and a call answers what CalculatorEnv answers, an error the same reason."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # `python -m examples...` from the clone, as user_code.py sets it
    cls = env_class("", specs({"command": "python", "args": ["-m", "examples.mcp_calculator.server"]}))
    assert tool_schemas(cls) == tool_schemas(CalculatorEnv)
    env = cls()
    try:
        assert env.calculator(expression="(347 * 29) - 12.5") == CalculatorEnv().calculator("(347 * 29) - 12.5")
        with pytest.raises(ValueError, match=r"^unsupported operator BitXor: use \*\* for powers"):
            env.calculator(expression="2 ^ 3")
    finally:
        env.close()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_each_trajectory_gets_its_own_server_through_the_env_host_and_close_stops_it(isolation):
    tools = specs({"command": sys.executable, "args": [COUNTER]})

    async def main():
        host = EnvHost(tool_timeout_s=20, isolation=isolation, max_threads=4)
        for key in ("a", "b"):
            await host.create(key, "", {}, {"id": key}, tools)
        out = {}
        for key in ("a", "b"):
            calls = [ToolCall("count", {}), ToolCall("count", {"step": 2}), ToolCall("count", {"step": 0})]
            calls += [ToolCall("count", {"step": "two"}), ToolCall("add", {})]
            out[key] = await host.call_tools(key, calls, [])
        alive = servers_alive(COUNTER)
        closed = [await host.close(k) for k in ("a", "b")]
        return out, alive, closed, host.stats()

    out, alive, closed, stats = asyncio.run(main())
    assert alive == 2  # one server per trajectory, started at its first call
    for key in ("a", "b"):
        texts = [r.text for r in out[key]]
        assert texts[:2] == ["1", "3"], texts  # each counts from 1: no state shared between trajectories
        assert texts[2] == "Error: count: step must be at least 1, got 0"  # is_error: the server's reason
        assert texts[3] == "Error: count: argument step: 'two' is not of type 'integer'"  # checked before the call
        assert texts[4].startswith("Error: unknown tool 'add'; available tools: count")
        assert [r.error for r in out[key]] == [False, False, True, True, True]
    assert closed == [True, True] and stats["open"] == 0
    deadline = time.monotonic() + 10
    while servers_alive(COUNTER) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert servers_alive(COUNTER) == 0  # close ended each trajectory's server


def test_a_bad_server_entry_or_a_server_that_does_not_start_is_one_clear_error(tmp_path):
    for entry, message in [
        ({"args": ["x"]}, r"env.mcp_servers\[0\]: a stdio server needs command"),
        ({"command": "python", "argz": []}, r"env.mcp_servers\[0\]: unknown keys \['argz'\]"),
        ({"url": "ftp://x"}, r"env.mcp_servers\[0\]: a URL server is \{url: http\(s\)://..., shared: bool\}"),
        ("python -m server", r"env.mcp_servers\[0\]: each server is a mapping"),
    ]:
        with pytest.raises(ConfigError, match=message):
            EnvConfig(name="", mcp_servers=[entry]).check()
    dying = tmp_path / "dying.py"
    dying.write_text("import sys\nsys.stderr.write('cannot open the database\\n')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"did not start: .*its stderr ends:\ncannot open the database"):
        env_class("", specs({"command": sys.executable, "args": [str(dying)]}))


def test_a_shared_server_serves_every_trajectory_and_comes_back_after_it_dies():
    """`shared: true`: one server for the process (its counter runs on across trajectories); SIGKILLed, the call in
    flight is that trajectory's error and the next call starts a new server."""
    tools = specs({"command": sys.executable, "args": [COUNTER, "shared"], "shared": True})
    cls = env_class("", tools)
    a, b = cls(), cls()
    try:
        assert [a.count(), b.count(), a.count()] == ["1", "2", "3"]
        for p in psutil.process_iter(["cmdline"]):
            if "shared" in (p.info["cmdline"] or []) and COUNTER in (p.info["cmdline"] or []):
                p.kill()
                p.wait(10)
        with pytest.raises(RuntimeError, match="MCP server .*mcp_counter_server.py shared"):
            b.count()
        assert b.count() == "1"  # a new server: the count starts again
    finally:
        a.close()
        b.close()
        from agentrl_ray.envs.adapters.mcp_tools import _close_shared

        _close_shared()
    assert servers_alive(COUNTER) == 0
