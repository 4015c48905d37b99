"""The environment contract (schemas, argument checks, loading), the calculator, and EnvHost without Ray."""

from __future__ import annotations

import asyncio
import enum
import math
import time
from typing import Literal

import pytest

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.base import Environment
from agentrl_ray.envs.builtin.calculator import CalculatorEnv, evaluate, format_number
from agentrl_ray.envs.host import EnvHost, ToolResult
from agentrl_ray.envs.loading import load_env_class
from agentrl_ray.envs.tools import coerce_arguments, function_schema, tool_methods, tool_schemas


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Custom:
    pass


class ShopEnv:
    """A TRL-style env: plain class, tools documented in three docstring styles."""

    def __init__(self, stock: int = 3) -> None:
        self.stock = stock
        self.log: list[str] = []

    def reset(self, **row) -> str | None:
        self.log.append(f"reset {row.get('id')}")
        return f" (stock {self.stock})"

    def buy(self, item: str, count: int = 1, express: bool | None = None) -> str:
        """Buy some items.

        Args:
            item: Name of the item.
            count: How many to buy.
            express: Ship by express.
        """
        if count > self.stock:
            raise ValueError(f"only {self.stock} left")
        self.stock -= count
        return f"bought {count} {item}"

    def paint(self, color: Color, shades: list[float], mode: Literal["matte", "gloss"] = "matte") -> dict:
        """Paint the shop.

        Parameters
        ----------
        color : Color
            The paint color.
        shades : list of float
            Shade levels.
        """
        return {"color": color.value, "shades": shades, "mode": mode}

    def weigh(self, grams: float, labels: dict[str, int] | None = None) -> float:
        """Weigh a parcel.

        :param grams: Weight in grams.
        :param labels: Label counts.
        """
        return grams / 1000

    @staticmethod
    def hours() -> str:
        """Opening hours."""
        return "9-17"

    @property
    def busy(self) -> bool:
        raise AssertionError("properties must not be evaluated when listing tools")

    def get_reward(self) -> float:
        return 1.0 if self.stock == 0 else 0.0

    def close(self) -> None:
        self.log.append("closed")

    def _private(self) -> None:
        """Not a tool."""


def _schemas_by_name(env) -> dict[str, dict]:
    return {s["function"]["name"]: s["function"] for s in tool_schemas(env)}


def test_tools_are_public_non_reserved_methods():
    assert sorted(tool_methods(ShopEnv())) == ["buy", "hours", "paint", "weigh"]
    assert sorted(_schemas_by_name(ShopEnv)) == ["buy", "hours", "paint", "weigh"]


def test_schema_google_docstring_and_optional_defaults():
    buy = _schemas_by_name(ShopEnv)["buy"]
    assert buy["description"] == "Buy some items."
    props = buy["parameters"]["properties"]
    assert props["item"] == {"type": "string", "description": "Name of the item."}
    assert props["count"] == {"type": "integer", "description": "How many to buy."}
    assert props["express"] == {"type": "boolean", "nullable": True, "description": "Ship by express."}
    assert buy["parameters"]["required"] == ["item"]


def test_schema_numpy_and_sphinx_docstrings_enum_literal_containers():
    schemas = _schemas_by_name(ShopEnv())
    paint = schemas["paint"]["parameters"]["properties"]
    assert paint["color"] == {"enum": ["red", "blue"], "description": "The paint color."}
    assert paint["shades"] == {"type": "array", "items": {"type": "number"}, "description": "Shade levels."}
    assert paint["mode"] == {"type": "string", "enum": ["matte", "gloss"]}
    weigh = schemas["weigh"]["parameters"]
    assert weigh["properties"]["labels"]["additionalProperties"] == {"type": "integer"}
    assert weigh["properties"]["grams"]["description"] == "Weight in grams."
    assert schemas["hours"]["parameters"] == {"type": "object", "properties": {}}


def test_schema_errors_name_the_problem():
    def untyped(x) -> str:
        """Doc."""

    def undocumented(x: int) -> str:
        pass

    def custom(x: Custom) -> str:
        """Doc."""

    with pytest.raises(TypeError, match="parameter 'x' has no type hint"):
        function_schema(untyped)
    with pytest.raises(ValueError, match="no docstring"):
        function_schema(undocumented)
    with pytest.raises(TypeError, match="parameter 'x'.*no JSON form"):
        function_schema(custom)


def test_load_env_class_errors():
    assert load_env_class("agentrl_ray.envs.builtin.calculator:CalculatorEnv") is CalculatorEnv
    assert load_env_class(f"{__name__}:ShopEnv") is ShopEnv
    with pytest.raises(ValueError, match="package.module:Name"):
        load_env_class("agentrl_ray.envs.builtin.calculator.CalculatorEnv")
    with pytest.raises(ImportError, match="no_such_module"):
        load_env_class("no_such_module:Env")
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        load_env_class("agentrl_ray.envs.builtin.calculator:Nope")
    with pytest.raises(TypeError, match="must be a class"):
        load_env_class("agentrl_ray.envs.builtin.calculator:evaluate")
    with pytest.raises(TypeError, match="must define reset"):
        load_env_class(f"{__name__}:Color")


def test_environment_base_class_is_optional_and_reserved():
    class Env(Environment):
        def ping(self) -> str:
            """Ping."""
            return "pong"

    assert list(tool_methods(Env())) == ["ping"]
    assert Env().reset(id=1) is None


def test_coerce_arguments_lossless_conversions():
    buy = ShopEnv().buy
    assert coerce_arguments(buy, {"item": 7, "count": "2"}) == {"item": "7", "count": 2}
    assert coerce_arguments(buy, {"item": "a", "count": 2.0, "express": "true"}) == {
        "item": "a",
        "count": 2,
        "express": True,
    }
    paint = ShopEnv().paint
    got = coerce_arguments(paint, {"color": "red", "shades": [1, "0.5"], "mode": "gloss"})
    assert got == {"color": Color.RED, "shades": [1.0, 0.5], "mode": "gloss"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"item": "a", "count": "two"}, "argument 'count': expected integer"),
        ({"item": "a", "count": 2.5}, "argument 'count': expected integer"),
        ({"item": "a", "count": True}, "argument 'count': expected integer"),
        ({"item": "a", "colour": "red"}, "unexpected argument 'colour'"),
        ({"count": 1}, "missing required argument 'item'"),
        ({"item": None}, "argument 'item': expected string"),
    ],
)
def test_coerce_arguments_rejects(arguments, message):
    with pytest.raises(ValueError, match=message):
        coerce_arguments(ShopEnv().buy, arguments)


def test_numbers_past_floats_range_are_argument_errors_not_crashes():
    """A model may write any number of digits: an int past 1e308 stays an int where one is wanted, and is an
    argument error (ValueError, which the env host returns as the call's error) where a float or a string is."""
    huge = 10**400
    assert coerce_arguments(ShopEnv().buy, {"item": "a", "count": huge}) == {"item": "a", "count": huge}
    with pytest.raises(ValueError, match="argument 'shades'.*expected number, got int 1000"):
        coerce_arguments(ShopEnv().paint, {"color": "red", "shades": [huge]})
    with pytest.raises(ValueError, match="argument 'item': expected string, got int of 16610 bits"):
        coerce_arguments(ShopEnv().buy, {"item": 10**5000})


def test_coerce_literal_and_enum_rejects():
    with pytest.raises(ValueError, match=r"one of \['matte', 'gloss'\]"):
        coerce_arguments(ShopEnv().paint, {"color": "red", "shades": [], "mode": "shiny"})
    with pytest.raises(ValueError, match="argument 'color'"):
        coerce_arguments(ShopEnv().paint, {"color": "green", "shades": []})


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-3 - -2", "-1"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("1 / 3", "0.333333333333"),
        ("0.1 + 0.2", "0.3"),
        ("347 * 29", "10063"),
        ("1.5e3 + 1", "1501"),
    ],
)
def test_calculator_values(expression, expected):
    assert CalculatorEnv().calculator(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("2 ** 1000", "exponent 1000 is too large"),
        ("10 ** 99 * 10 ** 99", "more than 100 digits"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("2 ^ 3", "use \\*\\* for powers"),
        ("__import__('os')", "unsupported syntax"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("2 +", "invalid expression"),
        ("1" * 600, "limit is 500"),
        ("(" * 249 + "1" + ")" * 249, "too many nested parentheses"),
    ],
)
def test_calculator_errors(expression, message):
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


def test_calculator_rejects_what_the_parser_warns_about_without_printing_it():
    """An expression like "5or 2" parses (with a SyntaxWarning Python prints to stderr) and is then rejected: the
    tool answers with the reason, and the console gets no line per call. In a fresh process: the warning is printed
    once per source."""
    import subprocess
    import sys

    script = (
        "from agentrl_ray.envs.builtin.calculator import evaluate\n"
        "for e in ('5or 2', '2in [1]', '1if 2 else 3'):\n"
        "    try:\n"
        "        evaluate(e)\n"
        "    except ValueError as err:\n"
        "        print(err)\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.count("unsupported syntax") == 3
    assert "SyntaxWarning" not in res.stderr, res.stderr


def test_calculator_env_contract():
    env = CalculatorEnv()
    assert env.reset(prompt="hi", answer="3") is None
    assert list(tool_methods(env)) == ["calculator"]
    assert format_number(2.0) == "2" and format_number(-12.5) == "-12.5"


# ---------------------------------------------------------------- EnvHost, driven without Ray


class SlowEnv:
    def reset(self, **row) -> None:
        return None

    def sleep(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "woke"

    async def asleep(self, seconds: float) -> str:
        """Sleep without blocking.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "woke async"

    def shout(self, text: str) -> str:
        """Repeat loudly.

        Args:
            text: What to shout.
        """
        return text.upper() * 10

    def reward(self, completion: str) -> float:
        return float("nan") if "nan" in completion else len(completion)

    def close(self) -> None:
        raise RuntimeError("close failed")


def test_env_host_lifecycle_tools_errors_and_stats():
    async def scenario():
        host = EnvHost(tool_timeout_s=5.0)
        assert await host.create("k", f"{__name__}:ShopEnv", {"stock": 2}, {"id": 7}) == " (stock 2)"
        with pytest.raises(ValueError, match="already open"):
            await host.create("k", f"{__name__}:ShopEnv", {}, {})
        calls = [
            ToolCall("buy", {"item": "pen", "count": "2"}),
            ToolCall("buy", {"item": "pen"}),  # out of stock now: calls run in order
            ToolCall("fly", {}),
            ToolCall("buy", {"count": 1}),
            ToolCall("paint", {"color": "red", "shades": [0.5]}),
        ]
        results = await host.call_tools("k", calls, ["tool call is not valid JSON"])
        assert results[0] == ToolResult("bought 2 pen", False)
        assert results[1] == ToolResult("Error: buy: only 0 left", True)
        assert results[2].error and "unknown tool 'fly'" in results[2].text and "buy, hours" in results[2].text
        assert results[3].error and "missing required argument 'item'" in results[3].text
        assert results[4] == ToolResult('{"color": "red", "shades": [0.5], "mode": "matte"}', False)
        assert results[5] == ToolResult("Error: could not parse tool call: tool call is not valid JSON", True)
        assert await host.env_reward("k", "done") == 1.0  # TRL's get_reward(): stock is 0
        assert await host.close("k") is True and await host.close("k") is False
        with pytest.raises(KeyError, match="no open environment 'k'"):
            await host.call_tools("k", [], [])
        return host.stats()

    stats = asyncio.run(scenario())
    assert stats == {
        "open": 0,
        "created": 1,
        "closed": 1,
        "calls": 5,
        "turns": 0,
        "errors": 4,
        "timeouts": 0,
        "parse_errors": 1,
        "close_errors": 0,
        "reward_errors": 0,
        "start_errors": 0,
        "stuck_threads": 0,
        "children_alive": 0,
        "children_started": 0,
        "children_killed": 0,
        "children_died": 0,
    }


def test_env_host_timeouts_truncation_reward_and_close_errors():
    async def scenario():
        host = EnvHost(tool_timeout_s=0.3, max_output_chars=40)
        assert await host.create("s", f"{__name__}:SlowEnv", {}, {}) is None
        t0 = time.perf_counter()
        slow = await host.call_tools("s", [ToolCall("sleep", {"seconds": 2}), ToolCall("asleep", {"seconds": 2})], [])
        elapsed = time.perf_counter() - t0
        fast = await host.call_tools("s", [ToolCall("asleep", {"seconds": 0}), ToolCall("shout", {"text": "abcd"})], [])
        rewards = (await host.env_reward("s", "four"), await host.env_reward("s", "nan"))
        await host.close("s")
        return host, slow, elapsed, fast, rewards

    host, slow, elapsed, fast, rewards = asyncio.run(scenario())
    assert [r.text for r in slow] == ["Error: sleep timed out after 0.3 s", "Error: asleep timed out after 0.3 s"]
    assert elapsed < 1.5  # neither call was waited for to the end
    assert fast[0] == ToolResult("woke async", False)
    assert fast[1] == ToolResult("ABCD" * 10, False)  # exactly at the limit: not truncated
    assert rewards[0] == 4.0 and math.isnan(rewards[1])
    stats = host.stats()
    assert (stats["timeouts"], stats["close_errors"], stats["reward_errors"], stats["open"]) == (2, 1, 1, 0)


def test_env_host_truncates_long_output():
    async def scenario():
        host = EnvHost(max_output_chars=15)
        await host.create("s", f"{__name__}:SlowEnv", {}, {})
        return await host.call_tools("s", [ToolCall("shout", {"text": "abc"})], [])

    (result,) = asyncio.run(scenario())
    assert result == ToolResult("ABCABCABCABCABC\n[truncated 15 characters]", False)
