"""OpenEnv environments, unchanged (agentrl_ray/envs/adapters/openenv.py): `env.name` names an OpenEnv class written
against its real API (tests/unit/openenv_envs.py; openenv 0.10.0 ships none), and the real EnvHost and multi-turn
loop run it at `thread` and `process` isolation."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import Field
from test_agent_loop_turns import run_turn_based
from test_env_adapters import PROMPT_TEXT

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.adapters.openenv import is_openenv_class, text_action
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.envs.loading import load_env_class
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.types import TokenRole

GUESS = "openenv_envs:GuessEnv"
ARITHMETIC = "openenv_envs:ArithmeticEnv"


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from agentrl_ray.builtin.tokenizer import load_tokenizer

    return load_tokenizer(builtin_model_path)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_an_openenv_environment_plays_through_the_loop_as_a_turn_based_one(tok, isolation):
    """Its observations are the user turns (environment tokens), its rewards add up, its `done` ends the episode."""
    import openenv_envs

    row = {"id": "g7", "prompt": "Play.", "seed": 7}
    target = openenv_envs.GuessEnv()
    target.reset(seed=7)
    guesses, lo, hi = [], 1, 10
    while not guesses or int(guesses[-1]) != target.target:  # binary search, as a player that reads hints would
        guesses.append(str((lo + hi) // 2))
        lo, hi = (int(guesses[-1]) + 1, hi) if int(guesses[-1]) < target.target else (lo, int(guesses[-1]) - 1)
    turns = [g + "<|im_end|>" for g in guesses]
    cfg = RolloutConfig(max_turns=8, max_tokens_per_turn=16, max_total_tokens=600)
    prompt, ep, reward = run_turn_based(tok, turns, cfg, GUESS, row, isolation, PROMPT_TEXT)
    assert ep.finish_reason == "done" and reward == 1.0
    hints = [m["content"] for m in ep.messages if m["role"] == "user"]
    assert len(hints) == len(guesses) - 1 and set(hints) <= {"higher", "lower"}
    env_text = tok.decode([t for t, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV])
    assert all(h in env_text for h in hints)


@pytest.mark.parametrize("served", [False, True], ids=["in-process", "served"])
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_an_openenv_mcp_environments_tools_are_tools_and_its_rewards_the_trajectorys(isolation, served, request):
    """The server's tools with their schemas; a call is a CallToolAction; a ToolError, a bad argument and a call after
    `done` are error observations; the observations' rewards are get_reward()'s. Served (`env.name:
    openenv:http://...`): the same through OpenEnv's MCPToolClient, one WebSocket session per trajectory."""
    name = f"openenv:{request.getfixturevalue('served_arithmetic')}" if served else ARITHMETIC
    cls = load_env_class(name)
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas(cls)}
    assert set(schemas) == {"add", "submit"}
    assert schemas["add"]["parameters"]["properties"]["x"] == {"type": "integer", "description": "the first"}

    async def main():
        # The process child imports openenv and fastmcp before its first call: 20 s was once not enough beside the
        # other xdist worker (a clean clone's CI); no call here waits on the deadline.
        host = EnvHost(tool_timeout_s=60, isolation=isolation, max_threads=4)
        out = {}
        for key, seed in (("a", 1), ("b", 2)):
            import openenv_envs

            env = openenv_envs.ArithmeticEnv()
            env.reset(seed=seed)
            total = env.a + env.b
            await host.create(key, name, {}, {"id": key, "seed": seed}, ())
            first = await host.call_tools(
                key, [ToolCall("add", {"x": env.a, "y": env.b}), ToolCall("add", {"x": 1})], []
            )
            answer = total if key == "a" else total + 1
            second = await host.call_tools(key, [ToolCall("submit", {"answer": answer})], [])
            after = await host.call_tools(key, [ToolCall("add", {"x": 1, "y": 2})], [])
            out[key] = (total, [r.text for r in first + second + after], await host.env_reward(key, ""))
            await host.close(key)
        return out

    out = asyncio.run(main())
    for key, (total, texts, reward) in out.items():
        assert texts[0] == str(total)
        assert texts[1].startswith("Error: add: ") and "'y'" in texts[1]  # checked against the schema before the call
        assert texts[2] == "submitted"
        assert texts[3] == "Error: add: the episode is over: the environment said done"
        assert reward == (1.0 if key == "a" else 0.0)


def test_an_action_that_does_not_validate_is_an_observation_not_a_crash():
    from openenv.core.env_server.types import Action

    class Move(Action):
        row: int = Field(ge=0, le=2)
        col: int = Field(ge=0, le=2)

    move, error = text_action(Move, '```json\n{"row": 1, "col": 2}\n```')
    assert (move.row, move.col, error) == (1, 2, "")
    for text, says in (
        ("row 1 col 2", "must be a JSON object"),
        ('{"row": 5, "col": 0}', "does not validate"),
        ("[1, 2]", "must be a JSON object"),
        ("[" * 100_000, "must be a JSON object"),
    ):
        move, error = text_action(Move, text)
        assert move is None and error.startswith("Error: ") and says in error


def test_only_openenv_classes_are_adapted():
    assert is_openenv_class(load_env_class(GUESS).__mro__[0]) is False  # the adapted class is ours
    import openenv_envs

    assert is_openenv_class(openenv_envs.GuessEnv) and is_openenv_class(openenv_envs.ArithmeticEnv)
    assert not is_openenv_class(CalculatorEnv)
    assert load_env_class("agentrl_ray.envs.builtin.calculator:CalculatorEnv") is CalculatorEnv


def _serve(app):
    """`app` served as OpenEnv serves it (uvicorn) on a loopback port, until the generator is closed."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def served_guess():
    """GuessEnv served as OpenEnv serves it (`create_fastapi_app` under uvicorn) on a loopback port."""
    import openenv_envs
    from openenv.core.env_server.http_server import create_fastapi_app

    app = create_fastapi_app(openenv_envs.GuessEnv, openenv_envs.GuessAction, openenv_envs.GuessObservation)
    yield from _serve(app)


@pytest.fixture(scope="module")
def served_arithmetic():
    """ArithmeticEnv (an MCPEnvironment) served the same way, its action OpenEnv's CallToolAction."""
    import openenv_envs
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    yield from _serve(create_fastapi_app(openenv_envs.ArithmeticEnv, CallToolAction, CallToolObservation))


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_served_openenv_app_plays_through_the_loop_over_its_websocket_client(tok, served_guess, isolation):
    """The same game, served: one session of OpenEnv's GenericEnvClient per trajectory; the action's field from the
    server's /schema; the hints the user turns, the reward the server's."""
    import openenv_envs

    row = {"id": "s5", "prompt": "Play.", "seed": 5}
    target = openenv_envs.GuessEnv()
    target.reset(seed=5)
    guesses, lo, hi = [], 1, 10
    while not guesses or int(guesses[-1]) != target.target:
        guesses.append(str((lo + hi) // 2))
        lo, hi = (int(guesses[-1]) + 1, hi) if int(guesses[-1]) < target.target else (lo, int(guesses[-1]) - 1)
    turns = ["no idea<|im_end|>"] + [g + "<|im_end|>" for g in guesses]  # a first turn that is not a number
    cfg = RolloutConfig(max_turns=8, max_tokens_per_turn=16, max_total_tokens=600)
    served = "agentrl_ray.envs.adapters.openenv:OpenEnvServer"
    prompt, ep, reward = run_turn_based(
        tok, turns, cfg, served, row, isolation, PROMPT_TEXT, env_kwargs={"url": served_guess}
    )
    assert ep.finish_reason == "done" and reward == 1.0
    hints = [m["content"] for m in ep.messages if m["role"] == "user"]
    assert hints[0] == "not a number" and set(hints[1:]) <= {"higher", "lower"} and len(hints) == len(guesses)


def test_a_served_action_that_does_not_match_its_schema_is_an_observation():
    from agentrl_ray.envs.adapters.openenv import schema_action

    schema = {
        "type": "object",
        "properties": {"row": {"type": "integer", "maximum": 2}, "col": {"type": "integer"}, "metadata": {}},
        "required": ["row", "col"],
    }
    assert schema_action(schema, '{"row": 1, "col": 2}') == ({"row": 1, "col": 2}, "")
    for text, says in (("1 2", "must be a JSON object"), ('{"row": 5, "col": 0}', "does not validate")):
        action, error = schema_action(schema, text)
        assert action is None and says in error


def test_a_served_app_is_named_by_its_url_and_its_schema_says_its_shape(served_guess, served_arithmetic):
    turn_based, tools = load_env_class(f"openenv:{served_guess}"), load_env_class(f"openenv:{served_arithmetic}")
    assert callable(getattr(turn_based, "step", None)) and tool_schemas(turn_based) == []
    assert {s["function"]["name"] for s in tool_schemas(tools)} == {"add", "submit"}
    assert not callable(getattr(tools, "step", None))
    with pytest.raises(ValueError, match="expected openenv:http://host:port"):
        load_env_class("openenv:localhost:8000")
