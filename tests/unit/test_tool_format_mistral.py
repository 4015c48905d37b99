"""Mistral's tool calls (`rollout.tool_format=mistral`: agentrl_ray/rollout/mistral.py), against mistral_common,
Mistral's reference renderer, on the tekken tokenizer it ships (`tekken_240911.json`, Pixtral 12B's: v3) made a
Hugging Face tokenizer by transformers' converter, with the chat template mistral_common generates for it; and on the
same vocabulary declared v7 (the layout of Mistral Small 3's tekken), with its v7 template:
- the parser reads the calls mistral_common and the template render, ids included, and turns malformed ones (a call
  without an id among them) into errors;
- the results are, token for token, what mistral_common encodes after the turn (v3: the content as a JSON value;
  v7: as it is), a malformed call's error naming the call 000000000;
- through the real loop, a calculator episode's ids are mistral_common's encoding of its messages, token for token;
- what cannot be framed is refused with the reason: v11's calls, a tokenizer that does not encode Mistral's control
  tokens from text (transformers' MistralCommonBackend), one that encodes pieces unlike the whole, user turns;
- the parser reads what vLLM's own (`mistral`) reads on the same transcripts.
All slow: the tekken tokenizer's conversion and mistral_common's imports take ~8 s (vLLM's another ~20 s).
"""

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import mistral_common
import pytest
from test_tool_format import NASTY, TOOLS, _episode, each_is_one_error

from agentrl_ray.chat_format import encode_segments
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.messages import to_openai
from agentrl_ray.rollout.mistral import parse_mistral
from agentrl_ray.rollout.tool_format import detect, tool_format
from agentrl_ray.types import TokenRole

pytestmark = pytest.mark.slow
DATA = Path(mistral_common.__file__).parent / "data"
CALL = '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "12 * 34"}, "id": "a1b2c3d4e"}]'


@pytest.fixture(scope="module")
def tekken(tmp_path_factory):
    """{layout: (the Hugging Face tokenizer, mistral_common's tokenizer of the same file)} for v3 and v7."""
    from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    v3 = DATA / "tekken_240911.json"
    raw = json.loads(v3.read_text())
    raw["config"]["version"] = "v7"
    v7 = tmp_path_factory.mktemp("tekken") / "tekken_v7.json"
    v7.write_text(json.dumps(raw))
    tok = convert_tekken_tokenizer(str(v3))  # its chat template: mistral_common's for the file
    tok7 = copy.copy(tok)  # the same vocabulary, its own template
    tok7.chat_template = convert_tokenizer_to_chat_template(str(v7))
    reference = {path: MistralTokenizer.from_file(str(path), mode=ValidationMode.agnostic) for path in (v3, v7)}
    return {"v3": (tok, reference[v3]), "v7": (tok7, reference[v7])}


def _encode(reference, messages, tools=None) -> list[int]:
    """mistral_common's ids of a conversation in OpenAI's form (its `encode_chat_completion`)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    return reference.encode_chat_completion(ChatCompletionRequest.from_openai(to_openai(messages), tools=tools)).tokens


def _call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_parser_reads_mistral_commons_calls_and_malformed_ones_are_errors(tekken):
    tok, reference = tekken["v3"]
    user = [{"role": "user", "content": "q"}]
    calls = [_call("get_weather", {"city": "Paris", "days": 3}, "a1b2c3d4e"), _call("f", {}, "b2c3d4e5f")]
    convo = user + [{"role": "assistant", "content": "", "tool_calls": calls}]
    ids = _encode(reference, convo)[len(_encode(reference, user)) :]
    head = tok.apply_chat_template(user, tokenize=False)
    templated = tok.apply_chat_template(convo, tokenize=False)[len(head) :]
    for text in (tok.decode(ids, skip_special_tokens=False), templated):
        turn = parse_mistral(text.removesuffix(tok.eos_token))
        assert [(c.name, c.arguments, c.id) for c in turn.calls] == [
            ("get_weather", {"city": "Paris", "days": 3}, "a1b2c3d4e"),
            ("f", {}, "b2c3d4e5f"),
        ]
        assert not turn.errors and turn.content == ""

    prose = parse_mistral('Let me look. [TOOL_CALLS] {"name": "f", "arguments": "{\\"x\\": 1}", "id": "a1b2c3d4e"}')
    assert prose.content == "Let me look." and [(c.name, c.arguments) for c in prose.calls] == [("f", {"x": 1})]
    answer = parse_mistral("The answer is [408].")
    assert not answer.calls and not answer.errors and answer.content == "The answer is [408]."
    malformed = {
        '[TOOL_CALLS][{"name": "f", "arguments": {"x": ': "not valid JSON",
        '[TOOL_CALLS][{"name": "f", "arguments": {}}]': 'has no "id"',
        '[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "call_0"}]': 'no "id" of 9 letters or digits',
        '[TOOL_CALLS][{"arguments": {}, "id": "a1b2c3d4e"}]': 'no "name"',
        '[TOOL_CALLS][{"name": "f", "arguments": [1], "id": "a1b2c3d4e"}]': "must be a JSON object, got list",
        '[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "a1b2c3d4e"}] and more': "text after the tool calls",
    }
    each_is_one_error(parse_mistral, malformed)


@pytest.mark.parametrize("layout", ["v3", "v7"])
def test_results_are_token_for_token_what_mistral_common_encodes(tekken, layout):
    tok, reference = tekken[layout]
    assert detect(tok.chat_template) == "mistral"
    fmt = tool_format(tok)
    assert fmt.name == "mistral" and fmt.framing.v7 == (layout == "v7") and fmt.stop_token_ids(tok) == [2]
    calls = [_call("f", {"x": str(i)}, f"a1b2c3d4{i}") for i in range(5)]
    results = [NASTY, "", "408", '{"a": [1, 2]}', "true", "malformed call's error"]  # the last answers no call
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    ids_of = [c["id"] for c in calls] + ["000000000"]
    answered = convo + [{"role": "tool", "tool_call_id": i, "content": r} for i, r in zip(ids_of, results)]
    expected = _encode(reference, answered)[len(_encode(reference, convo)) :]
    ids, roles = encode_segments(tok, fmt.tool_response_segments(results, calls))
    assert ids == expected
    env = [tok.decode([i for i, r in zip(ids, roles) if r == TokenRole.ENV])]
    if layout == "v7":  # the content as it is
        assert env == ["".join(results)]
    else:  # the content as a JSON value, with the space before it and the comma after it that share its tokens
        values = [json.dumps(NASTY, ensure_ascii=False), "{}", "408", '{"a": [1, 2]}', "true"]
        assert env == ["".join(f" {v}," for v in [*values, json.dumps(results[-1])])]


@pytest.mark.parametrize("layout", ["v3", "v7"])
def test_an_episode_is_token_for_token_what_mistral_common_encodes(tekken, layout):
    tok, reference = tekken[layout]
    tools = tool_schemas(CalculatorEnv)
    question, prompt, ep = _episode(tok, [CALL + tok.eos_token, "The answer is 408." + tok.eos_token], tools)
    assert ep.finish_reason == "answer" and ep.num_tool_calls == 1 and ep.num_tool_errors == 0
    assistant, result, final = ep.messages
    assert assistant["tool_calls"][0]["id"] == result["tool_call_id"] == "a1b2c3d4e" and result["content"] == "408"
    assert ep.ids == _encode(reference, question + ep.messages, tools)  # the prompt from the template, too
    with pytest.raises(ValueError, match="before the last user message"):
        tool_format(tok).user_turn_segments("more")


class _DummyPrefix:
    """A sentencepiece tokenizer's habit: every text it encodes opens with a word-start piece."""

    def __init__(self, tok):
        self.tok, self.chat_template = tok, tok.chat_template

    def encode(self, text, add_special_tokens=False):
        ids = self.tok.encode(text, add_special_tokens=False)
        return ids if len(ids) == 1 else self.tok.encode(" ", add_special_tokens=False) + ids


def test_what_cannot_be_framed_as_mistral_common_encodes_is_refused(tekken):
    from transformers import MistralCommonBackend

    tok, _ = tekken["v3"]
    v11 = SimpleNamespace(chat_template="[TOOL_CALLS]{{ name }}[ARGS]{{ arguments }}")
    with pytest.raises(ValueError, match=r"v11's \[TOOL_CALLS\]NAME\[ARGS\]"):
        tool_format(v11, "mistral")
    with pytest.raises(ValueError, match="MistralCommonBackend never does"):
        tool_format(MistralCommonBackend(DATA / "tekken_240911.json"), "mistral")
    with pytest.raises(ValueError, match="pieces unlike the whole"):
        tool_format(_DummyPrefix(tok), "mistral")


TRANSCRIPTS = [
    '[TOOL_CALLS][{"name": "f", "arguments": {"x": "a", "n": 3}, "id": "a1b2c3d4e"}]',
    'Two. [TOOL_CALLS][{"name": "f", "arguments": {"x": "a b"}, "id": "a1b2c3d4e"}, '
    '{"name": "g", "arguments": {}, "id": "b2c3d4e5f"}]',
    '[TOOL_CALLS] {"name": "f", "arguments": "{\\"x\\": \\"q\\"}", "id": "a1b2c3d4e"}',
    "The answer is 408.",
]


def test_the_parser_reads_what_vllms_mistral_parser_reads(tekken):
    """The same transcripts through vLLM's `mistral` tool parser (what its server answers a chat client with) and
    ours: the same calls, names and arguments, and content. Where they part on purpose: a call without an "id" is an
    error here (vLLM makes one up, which the model never sampled), as is text after the calls (vLLM drops it)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.mistral_tool_parser import MistralToolParser

    tok, _ = tekken["v3"]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS)
    for text in TRANSCRIPTS:
        theirs = MistralToolParser(tok, TOOLS).extract_tool_calls(text, request)
        ours = parse_mistral(text)
        expected = [(c.function.name, json.loads(c.function.arguments)) for c in theirs.tool_calls]
        assert [(c.name, c.arguments) for c in ours.calls] == expected, text
        assert ours.content == (theirs.content or "").strip() and not ours.errors
