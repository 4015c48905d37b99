"""Hermes tool-call parsing and final-answer extraction."""

import pytest

from agentrl_ray.chat_format import ToolCall, extract_final_answer, parse_tool_calls


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def test_single_call_and_content():
    turn = parse_tool_calls("Let me compute.\n" + _call("calculator", '{"expression": "2 + 2"}'))
    assert turn.calls == [ToolCall("calculator", {"expression": "2 + 2"})]
    assert turn.errors == []
    assert turn.content == "Let me compute."


def test_several_calls_in_order_with_text_between():
    text = _call("a", '{"x": 1}') + " then " + _call("b", "{}") + "\n" + _call("c", '{"y": [1, 2]}')
    turn = parse_tool_calls(text)
    assert [c.name for c in turn.calls] == ["a", "b", "c"]
    assert turn.calls[2].arguments == {"y": [1, 2]}
    assert turn.content == "then"


def test_plain_answer_has_no_calls():
    turn = parse_tool_calls("The answer is 42.")
    assert (turn.calls, turn.errors, turn.content) == ([], [], "The answer is 42.")


def test_openai_style_string_arguments_and_missing_arguments():
    turn = parse_tool_calls(_call("f", '"{\\"k\\": 3}"') + '<tool_call>{"name": "g"}</tool_call>')
    assert turn.calls == [ToolCall("f", {"k": 3}), ToolCall("g", {})]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>\n{not json}\n</tool_call>", "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": 5}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', '"arguments" must be a JSON object, got list'),
        ('<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>', "string that is not a JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": {"x": ', "unclosed <tool_call>"),
        ("done</tool_call>", "without a matching <tool_call>"),
    ],
)
def test_malformed_calls_become_errors(text, message):
    turn = parse_tool_calls(text)
    assert turn.calls == []
    assert len(turn.errors) == 1 and message in turn.errors[0], turn.errors


def test_good_and_bad_calls_mixed():
    text = _call("a", "{}") + "<tool_call>oops</tool_call>" + _call("b", '{"z": null}') + "<tool_call>{"
    turn = parse_tool_calls(text)
    assert turn.calls == [ToolCall("a", {}), ToolCall("b", {"z": None})]
    assert len(turn.errors) == 2
    assert "not valid JSON" in turn.errors[0] and "unclosed" in turn.errors[1]


def test_long_bad_block_is_snipped_in_error():
    turn = parse_tool_calls("<tool_call>" + "x" * 500 + "</tool_call>")
    assert len(turn.errors[0]) < 200


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is -12.5.", "-12.5"),
        ("347 * 29 = 10063", "10063"),
        ("10-3=7", "7"),
        ("So we get 10 - 3, which is 7.", "7"),
        ("It costs $1,234.50 in total.", "1234.50"),
        ("Values 3,4", "4"),
        ("The result: -.5", "-.5"),
        ("about 1e5 atoms", "1e5"),
        ("x2 is the answer", None),
        ("No idea.", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, number):
    assert extract_final_answer(text) == number
