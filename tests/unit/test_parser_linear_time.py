"""Every parser of sampled text runs in linear time: a policy that repeats a tag, nests or unbalances tags, or writes
a megabyte must not stall a rollout worker (`<tool_call>` repeated 20,000 times once took 36 s to parse).

Each parser gets adversarial inputs of 100 KB and 1 MB: the larger may take at most 15x the CPU time of the smaller
(a quadratic parser takes 100x), and 1 MB at most 50 ms unless its case says why it needs more. Times are CPU time
(`time.process_time`, so a loaded machine's other processes do not count), the best of 3 runs, garbage collection
off, measured again (up to 3 times) when a burst of load from elsewhere breaks a bound; below `NOISE_S` a run is
noise, so the ratio is taken against at least that. docs/parsers.md has the curves.
"""

import gc
import json
import math
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_ray.chat_format import (
    _NUMBER,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedTurn,
    _parse_block,
    _snip,
    extract_final_answer,
    parse_tool_calls,
)
from agentrl_ray.envs.builtin.code_exec import final_code
from agentrl_ray.rewards.builtin import count_tool_calls, final_answer_text
from agentrl_ray.rollout.endpoint.server import stop_prefix_len
from agentrl_ray.rollout.harmony import parse_harmony
from agentrl_ray.rollout.mistral import parse_mistral
from agentrl_ray.rollout.tool_format import parse_llama3_json, parse_qwen3_xml

KB, MB = 100_000, 1_000_000
NOISE_S = 0.3e-3
LINEAR_MS = 50

# Per-item costs, not superlinear ones: these inputs hold tens of thousands of items in a megabyte, each parsed by
# Python code (a json.loads and its exception, a regex match and its string).
CALL_MS = 1000  # 1 MB of 25-character blocks: 40,000 calls, ~5 us each (json.loads, an error message per block)
NUMBER_MS = 500  # "1 1 1 ...": 500,000 numbers (200,000 of "1,000"), ~200 ns per regex match and its string


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _closed(opening: str, unit: str, closing: str):
    return lambda size: opening + _fill(unit, size - len(opening) - len(closing)) + closing


CASES = [
    # (name, parser, its input of a given size, its bound at 1 MB in ms)
    ("repeated <tool_call>", parse_tool_calls, lambda n: _fill(TOOL_CALL_OPEN, n), LINEAR_MS),
    ("repeated </tool_call>", parse_tool_calls, lambda n: _fill(TOOL_CALL_CLOSE, n), LINEAR_MS),
    (
        "nested tags",
        parse_tool_calls,
        lambda n: _fill(TOOL_CALL_OPEN, n // 2) + _fill(TOOL_CALL_CLOSE, n // 2),
        LINEAR_MS,
    ),
    (
        "unbalanced <tool_call><tool_call></tool_call>",
        parse_tool_calls,
        lambda n: _fill("<tool_call>" * 2 + "</tool_call>", n),
        CALL_MS,
    ),
    ("unclosed call, long body", parse_tool_calls, _closed(TOOL_CALL_OPEN, '{"name": "f", "x', ""), LINEAR_MS),
    ("near-tags", parse_tool_calls, lambda n: _fill("<tool_call</tool_call<tool_call>", n), LINEAR_MS),
    ("one call, deep JSON", parse_tool_calls, _closed(TOOL_CALL_OPEN, "[", TOOL_CALL_CLOSE), LINEAR_MS),
    (
        "one call, 1 MB argument",
        parse_tool_calls,
        _closed(TOOL_CALL_OPEN + '{"name": "f", "arguments": {"s": "', "ab\\n", '"}}' + TOOL_CALL_CLOSE),
        LINEAR_MS,
    ),
    ("one call, digits", parse_tool_calls, _closed(TOOL_CALL_OPEN, "7", TOOL_CALL_CLOSE), LINEAR_MS),
    ("many malformed calls", parse_tool_calls, lambda n: _fill(TOOL_CALL_OPEN + "{x" + TOOL_CALL_CLOSE, n), CALL_MS),
    (
        "many calls",
        parse_tool_calls,
        lambda n: _fill(TOOL_CALL_OPEN + '{"name": "f", "arguments": {}}' + TOOL_CALL_CLOSE, n),
        CALL_MS,
    ),
    ("final answer after repeated <tool_call>", final_answer_text, lambda n: _fill(TOOL_CALL_OPEN, n), LINEAR_MS),
    ("tool-call count, repeated <tool_call>", count_tool_calls, lambda n: _fill(TOOL_CALL_OPEN, n), LINEAR_MS),
    ("answer number, digits", extract_final_answer, lambda n: _fill("7", n), LINEAR_MS),
    ("answer number, text", extract_final_answer, lambda n: _fill("the answer is x. ", n), LINEAR_MS),
    ("answer number, 1,000 groups", extract_final_answer, lambda n: _fill("1,000", n), NUMBER_MS),
    ("answer number, - . flood", extract_final_answer, lambda n: _fill("-.", n), NUMBER_MS),
    ("answer number, 1 1 1", extract_final_answer, lambda n: _fill("1 ", n), NUMBER_MS),
    ("llama3: repeated call openings", parse_llama3_json, lambda n: _fill('{"name":', n), LINEAR_MS),
    ("llama3: one call, deep JSON", parse_llama3_json, _closed('{"name": "f", "parameters": ', "[", "}"), LINEAR_MS),
    (
        "llama3: many calls",
        parse_llama3_json,
        lambda n: _fill('{"name": "f", "parameters": {}}; ', n),
        CALL_MS,
    ),
    ("qwen3 xml: repeated <tool_call>", parse_qwen3_xml, lambda n: _fill(TOOL_CALL_OPEN, n), LINEAR_MS),
    (
        "qwen3 xml: unclosed parameters",
        parse_qwen3_xml,
        _closed(TOOL_CALL_OPEN + "<function=f>", "<parameter=x>1", "</function>" + TOOL_CALL_CLOSE),
        LINEAR_MS,
    ),
    (
        "qwen3 xml: many parameters",
        parse_qwen3_xml,
        _closed(TOOL_CALL_OPEN + "<function=f>", "<parameter=x>\n1\n</parameter>", "</function>" + TOOL_CALL_CLOSE),
        CALL_MS,
    ),
    ("harmony: repeated <|start|>", parse_harmony, _closed("<|channel|>final<|message|>a", "<|start|>", ""), LINEAR_MS),
    ("harmony: repeated <|message|>", parse_harmony, lambda n: _fill("<|message|>", n), LINEAR_MS),
    ("harmony: repeated to=", parse_harmony, _closed("<|channel|>commentary", " to=x", "<|message|>{}"), LINEAR_MS),
    ("harmony: unended body", parse_harmony, _closed("<|channel|>final<|message|>", "ab<|", ""), LINEAR_MS),
    (
        "harmony: one call, deep JSON",
        parse_harmony,
        _closed("<|channel|>commentary to=functions.f json<|message|>", "[", "<|call|>"),
        LINEAR_MS,
    ),
    (
        "harmony: many messages",
        parse_harmony,
        lambda n: _fill("<|start|>assistant<|channel|>analysis<|message|>x<|end|>", n),
        CALL_MS,
    ),
    ("mistral: repeated [TOOL_CALLS]", parse_mistral, lambda n: _fill("[TOOL_CALLS]", n), LINEAR_MS),
    ("mistral: one call, deep JSON", parse_mistral, _closed("[TOOL_CALLS]", "[", "]"), LINEAR_MS),
    (
        "mistral: many calls",
        parse_mistral,
        _closed("[TOOL_CALLS][", '{"name": "f", "arguments": {}, "id": "a1b2c3d4e"}, ', "{}]"),
        CALL_MS,
    ),
    ("mistral: many malformed calls", parse_mistral, _closed("[TOOL_CALLS][", '{"x": 1}, ', "{}]"), CALL_MS),
    ("code block, repeated fences", final_code, lambda n: _fill("```python\n", n), LINEAR_MS),
    ("code block, unclosed", final_code, _closed("```python\n", "x = 1\n", ""), LINEAR_MS),
    ("code block, fence with spaces", final_code, lambda n: _fill("```py" + " " * 50, n), LINEAR_MS),
]


def _cpu_time(fn, arg, limit_s: float) -> float:
    """The best of 3 runs; a run 10x over `limit_s` ends the measurement (a quadratic parser fails fast)."""
    best = math.inf
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            t0 = time.process_time()
            fn(arg)
            best = min(best, time.process_time() - t0)
            if best > 10 * limit_s:
                break
    finally:
        if gc_was_on:
            gc.enable()
    return best


@pytest.mark.parametrize(("fn", "make", "bound_ms"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parser_time_grows_linearly(fn, make, bound_ms):
    small, big = make(KB), make(MB)
    assert len(small) == KB and len(big) == MB
    limit_s = bound_ms / 1e3
    for _ in range(3):  # a burst of load from elsewhere can slow one measurement; a quadratic parser fails all three
        t_small = _cpu_time(fn, small, limit_s)
        t_big = _cpu_time(fn, big, limit_s) if t_small <= limit_s else math.inf
        if t_big <= min(15 * max(t_small, NOISE_S), limit_s):
            break
    assert t_small <= limit_s, f"100 KB took {t_small * 1e3:.1f} ms, more than 1 MB may take ({bound_ms} ms)"
    assert t_big <= 15 * max(t_small, NOISE_S), f"100 KB: {t_small * 1e3:.2f} ms, 1 MB: {t_big * 1e3:.2f} ms"
    assert t_big <= limit_s, f"1 MB took {t_big * 1e3:.1f} ms (bound {bound_ms} ms)"


# ---------------------------------------------------------------- the linear scan reads what the regex read


_REGEX_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def _regex_parse_tool_calls(text: str) -> ParsedTurn:
    """The parser as it was before its linear scan (quadratic on repeated opening tags): the oracle."""
    turn = ParsedTurn()
    outside: list[str] = []
    pos = 0
    for match in _REGEX_BLOCK.finditer(text):
        outside.append(text[pos : match.start()])
        pos = match.end()
        call, error = _parse_block(match.group(1))
        if call is not None:
            turn.calls.append(call)
        else:
            turn.errors.append(error)
    tail = text[pos:]
    if TOOL_CALL_OPEN in tail:
        start = tail.index(TOOL_CALL_OPEN)
        snippet = _snip(tail[start + len(TOOL_CALL_OPEN) :])
        turn.errors.append(f"unclosed {TOOL_CALL_OPEN} tag (no {TOOL_CALL_CLOSE} after: {snippet})")
        tail = tail[:start]
    if TOOL_CALL_CLOSE in "".join(outside) + tail:
        turn.errors.append(f"{TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}")
    outside.append(tail)
    turn.content = "".join(outside).replace(TOOL_CALL_CLOSE, "").strip()
    return turn


_PIECES = [
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    "<tool_call",
    "tool_call>",
    "</",
    "<",
    ">",
    json.dumps({"name": "f", "arguments": {"x": 1}}),
    '{"name": "g"',
    "}",
    "[",
    " ",
    "\n",
    "text",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_linear_scan_parses_as_the_regex_did(text):
    assert parse_tool_calls(text) == _regex_parse_tool_calls(text)


_REGEX_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w.])-?\.\d+")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789,.-+eEx _", max_size=40))
def test_the_number_pattern_finds_what_its_earlier_form_found(text):
    assert _NUMBER.findall(text) == _REGEX_NUMBER.findall(text)


# ---------------------------------------------------------------- the endpoint's stop strings


class _ByteTokenizer:
    """Ids are UTF-8 bytes; a cut character decodes to one replacement character, as byte-level BPE decodes."""

    def __init__(self) -> None:
        self.decodes = 0

    def decode(self, ids: list[int]) -> str:
        self.decodes += 1
        return bytes(ids).decode("utf-8", errors="replace")


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=40), st.data())
def test_stop_prefix_is_the_shortest_prefix_past_the_cut(text, data):
    tokenizer = _ByteTokenizer()
    ids = list(text.encode())
    cut = data.draw(st.integers(0, len(tokenizer.decode(ids)) - 1))
    shortest = next(k for k in range(1, len(ids) + 1) if len(tokenizer.decode(ids[:k])) > cut)
    assert stop_prefix_len(tokenizer, ids, cut) == shortest


def test_stop_prefix_takes_logarithmically_many_decodes():
    tokenizer = _ByteTokenizer()
    ids = list(_fill("é answer ", MB).encode())
    cut = len(tokenizer.decode(ids)) - 5
    tokenizer.decodes = 0
    t0 = time.process_time()
    k = stop_prefix_len(tokenizer, ids, cut)
    elapsed = time.process_time() - t0
    decodes = tokenizer.decodes
    assert len(tokenizer.decode(ids[: k - 1])) <= cut < len(tokenizer.decode(ids[:k]))
    assert decodes <= math.ceil(math.log2(len(ids) + 1)) + 1
    # 21 decodes of up to 1.1 M ids, ~0.3 s here (the toy decode turns a list into bytes); a prefix at a time: hours
    assert elapsed <= 2.0, f"{elapsed:.2f} s for {len(ids):,} ids"
