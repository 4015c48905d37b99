"""Property tests (hypothesis) of the parsers that read what others wrote: the model's tool calls, the command line's
overrides, a user's JSONL rows. Each either reads its input back exactly or refuses it with a ConfigError (or, for
tool calls, an error observation) that names the place; none crashes on anything."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl_ray.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, parse_tool_calls, render_tool_call
from agentrl_ray.config import ConfigError, DataConfig, parse_overrides
from agentrl_ray.data import load_rows

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
names = st.text(st.characters(categories=("L", "N"), include_characters="_-."), min_size=1, max_size=20)
calls = st.builds(ToolCall, name=names, arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=4))
# Prose between calls: anything but the tags themselves.
prose = st.text(max_size=40).filter(lambda s: TOOL_CALL_OPEN not in s and TOOL_CALL_CLOSE not in s)


@FAST
@given(st.lists(st.tuples(prose, calls), max_size=4), prose)
def test_rendered_tool_calls_parse_back_exactly(pieces, tail):
    text = "".join(before + render_tool_call(call) for before, call in pieces) + tail
    turn = parse_tool_calls(text)
    assert turn.errors == []
    assert turn.calls == [call for _, call in pieces]
    assert turn.content == ("".join(before for before, _ in pieces) + tail).strip()


@FAST
@given(st.text(max_size=200))
def test_any_text_parses_without_crashing(text):
    turn = parse_tool_calls(text)
    assert all(isinstance(c, ToolCall) and c.name for c in turn.calls)
    assert all(isinstance(e, str) and e for e in turn.errors)
    assert TOOL_CALL_CLOSE not in turn.content


@FAST
@given(st.text(max_size=60).filter(lambda s: TOOL_CALL_CLOSE not in s))
def test_a_malformed_block_is_one_error_never_a_call(body):
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    well_formed = isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"].strip()
    turn = parse_tool_calls(f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}")
    assert len(turn.calls) + len(turn.errors) >= 1
    if not well_formed:
        assert turn.calls == [] and len(turn.errors) >= 1


@FAST
@given(st.text(max_size=60))
def test_a_call_cut_off_mid_way_is_an_error(partial):
    turn = parse_tool_calls(f"thinking {TOOL_CALL_OPEN}{partial.replace(TOOL_CALL_CLOSE, '')}")
    assert any("unclosed" in e for e in turn.errors)


keys = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True), min_size=1, max_size=3).map(".".join)
yaml_scalars = (
    st.integers()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.from_regex(
        r"[a-z][a-z0-9_/]{0,8}(://[a-z0-9_/]{1,8})?",
        fullmatch=True,  # names, paths, URIs (a trailing ':' is YAML's)
    ).filter(lambda s: s not in ("yes", "no", "on", "off", "true", "false", "null", "y", "n"))
)


@FAST
@given(st.dictionaries(keys, yaml_scalars, min_size=1, max_size=5))
def test_overrides_read_back_their_values(pairs):
    def prefix_of_another(k):
        return any(o != k and (o.startswith(k + ".") or k.startswith(o + ".")) for o in pairs)

    pairs = {k: v for k, v in pairs.items() if not prefix_of_another(k)}
    parsed = parse_overrides([f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in pairs.items()])
    for key, value in pairs.items():
        node = parsed
        for part in key.split("."):
            node = node[part]
        # YAML 1.1 reads 1e-05 (no dot) as a string; the config's type check reads it as the number (checking.py).
        assert node == value or (isinstance(value, float) and float(node) == value), (node, value)


@FAST
@given(st.text(max_size=30))
def test_any_override_parses_or_is_a_config_error(item):
    try:
        parsed = parse_overrides([item])
    except ConfigError as exc:
        assert str(exc).startswith("override ")
    else:
        assert isinstance(parsed, dict) and parsed


rows = st.fixed_dictionaries(
    {"prompt": st.text(min_size=1, max_size=30)},
    optional={"id": st.integers() | st.text(max_size=8), "answer": json_values},
)


@FAST
@given(st.lists(rows, min_size=1, max_size=6))
def test_jsonl_rows_read_back(tmp_path_factory, written):
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in written))
    loaded = load_rows(str(path), DataConfig(), split="train", size=len(written))
    assert [r["prompt"] for r in loaded] == [r["prompt"] for r in written]
    assert [r["id"] for r in loaded] == [str(r.get("id", i)) for i, r in enumerate(written)]


@FAST
@given(st.lists(json_values, min_size=1, max_size=4), st.integers(0, 3))
def test_a_bad_jsonl_row_is_a_config_error_naming_it(tmp_path_factory, values, bad_at):
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    lines = [json.dumps({"prompt": "ok"})] * 4
    lines[bad_at] = json.dumps(values[0]) if not isinstance(values[0], dict) else "{not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        load_rows(str(path), DataConfig(), split="train", size=4)
    assert f"row {bad_at}" in str(err.value) or f"rows.jsonl:{bad_at + 1}:" in str(err.value)


# Adversarial shapes of model output: deep nesting, huge inputs, nested or unbalanced tags, control characters,
# broken JSON. Every parser on the path of a model's output returns (an error observation at worst), and the reward
# of such a turn is a number: it costs at most its own trajectory.
adversarial = st.one_of(
    st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),  # json's decoder recurses once per level
    st.integers(1, 200_000).map(lambda n: '{"a": ' * n + "1" + "}" * n),
    st.integers(1, 3_000).map(lambda n: TOOL_CALL_OPEN * n + "x" + TOOL_CALL_CLOSE * (n // 2)),
    st.integers(1, 2_000_000).map(lambda n: "9" * n),
    st.text(st.characters(categories=("Cc", "Cs", "Co", "Zl", "Zp")), max_size=300),
    st.text(alphabet='{}[]":,\\ntrue0-.eE' + TOOL_CALL_OPEN + TOOL_CALL_CLOSE, max_size=300),
)


def _as_call(body: str) -> str:
    return f'{TOOL_CALL_OPEN}{{"name": "calculator", "arguments": {body}}}{TOOL_CALL_CLOSE}'


@FAST
@given(adversarial, st.sampled_from(["bare", "call", "arguments-string"]))
def test_adversarial_model_output_never_raises(body, wrap):
    from agentrl_ray.chat_format import extract_final_answer
    from agentrl_ray.rewards.builtin import answer_match, count_tool_calls

    text = {"bare": body, "call": _as_call(body), "arguments-string": _as_call(json.dumps(body))}[wrap]
    parsed = parse_tool_calls(text)
    assert all(isinstance(e, str) and e for e in parsed.errors)
    assert all(isinstance(c.arguments, dict) for c in parsed.calls)
    extract_final_answer(text)
    completion = [{"role": "assistant", "content": text}]
    assert answer_match([completion, text], [7, 7]) in ([0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0])
    assert min(count_tool_calls(completion)) >= 0


def test_deeply_nested_tool_call_json_is_one_error():
    """Found by the property above: 100,000 nested brackets made json raise RecursionError out of the parser."""
    parsed = parse_tool_calls(_as_call("[" * 100_000 + "]" * 100_000))
    assert parsed.calls == [] and len(parsed.errors) == 1 and "nested too deeply" in parsed.errors[0]


def test_a_deeply_nested_jsonl_row_is_a_config_error(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ConfigError, match="rows.jsonl:2: JSON nested too deeply"):
        load_rows(str(path), DataConfig(), split="train", size=2)


def test_a_tool_call_with_a_huge_integer_is_one_error():
    """Found by the property above: an integer of 4,301 digits made json raise ValueError (Python's limit on int
    conversion), which is not a JSONDecodeError."""
    parsed = parse_tool_calls(_as_call("9" * 4301))
    assert parsed.calls == [] and len(parsed.errors) == 1 and "cannot be read" in parsed.errors[0]
