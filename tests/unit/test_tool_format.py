"""Tool-call formats of other model families (agentrl_ray/rollout/tool_format.py), against the real chat templates
TRL ships (`trl/chat_templates/*.jinja`: Llama 3.1 / 3.2, Qwen2.5, Qwen3, Qwen3.6) on the built-in model's tokenizer
with each family's special tokens added:
- each parser reads what its template renders for an assistant turn's calls, and turns malformed calls into errors;
- the segments cut from a template are, joined, what `apply_chat_template` renders after the turn, contents
  quoted, escaped or trimmed as the template does; on Qwen2.5's template they are the hand-written hermes segments;
- through the real multi-turn loop (scripted engine, real EnvHost and calculator), a Llama 3.2 and a Qwen3.5
  episode's ids are, token for token, the template's rendering of the episode's messages.
"""

import asyncio
import copy
import json
from pathlib import Path

import pytest
import trl
from test_agent_loop import LocalHandle, ScriptedEngine

from agentrl_ray.chat_format import tool_response_segments, user_turn_segments
from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.rollout.agent_loop import Episode, run_episodes
from agentrl_ray.rollout.tool_format import (
    HERMES,
    TemplateFraming,
    detect,
    parse_llama3_json,
    parse_qwen3_xml,
    tool_format,
)
from agentrl_ray.types import RolloutTimings, TokenRole

TEMPLATES = Path(trl.__file__).parent / "chat_templates"
LLAMA_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]
# A tool result and a user turn a template may quote (Llama's tojson), escape or trim.
NASTY = ' 408 "quoted" <b> & \\ {x}\n\tüñí '


@pytest.fixture(scope="module")
def base(builtin_model_path):
    from agentrl_ray.builtin.tokenizer import load_tokenizer

    return load_tokenizer(builtin_model_path)


def family(base, template: str):
    """The built-in tokenizer speaking `template`, its special tokens single tokens, its eos the turn's end."""
    tok = copy.deepcopy(base)
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    llama = template.startswith("llama")
    tok.add_special_tokens({"additional_special_tokens": LLAMA_TOKENS if llama else ["<|im_start|>", "<|im_end|>"]})
    tok.add_special_tokens({"eos_token": "<|eot_id|>" if llama else "<|im_end|>"})
    return tok


CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}


def each_is_one_error(parse, malformed: dict[str, str]) -> None:
    """Each text of `malformed` parses to exactly one error, which says what its value says."""
    for text, error in malformed.items():
        errors = parse(text).errors
        assert len(errors) == 1 and error in errors[0], (text, errors)


def _rendered_call(tok) -> str:
    """What the template renders for an assistant turn with CALL, between the generation prompt and the eos."""
    head = tok.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}], tokenize=False
    )
    assert full.startswith(head)
    return full[len(head) :].split(tok.eos_token)[0]


@pytest.mark.parametrize("template", ["llama3_1", "llama3_2"])
def test_llama3_reads_its_templates_calls_and_malformed_ones_are_errors(base, template):
    turn = parse_llama3_json(_rendered_call(family(base, template)))
    assert [(c.name, c.arguments) for c in turn.calls] == [("get_weather", {"city": "Paris", "days": 3})]
    assert not turn.errors and turn.content == ""

    two = parse_llama3_json('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}')
    assert [(c.name, c.arguments) for c in two.calls] == [("a", {}), ("b", {"x": 1})] and not two.errors
    prose = parse_llama3_json('Let me look. {"name": "a", "parameters": {"q": "x"}}')
    assert prose.content == "Let me look." and [c.name for c in prose.calls] == ["a"]
    answer = parse_llama3_json("The answer is {4}.")
    assert not answer.calls and not answer.errors and answer.content == "The answer is {4}."
    assert "not valid JSON" in parse_llama3_json('{"name": "a", "parameters": {"q": ').errors[0]
    assert 'no "name"' in parse_llama3_json('{"name": "", "parameters": {}}').errors[0]
    assert "must be a JSON object" in parse_llama3_json('{"name": "a", "parameters": [1]}').errors[0]
    assert "text after a tool call" in parse_llama3_json('{"name": "a", "parameters": {}} and more').errors[0]


@pytest.mark.parametrize("template", ["qwen3_6", "qwen3_5_nothink"])
def test_qwen3_xml_reads_its_templates_calls_and_malformed_ones_are_errors(base, template):
    tok = family(base, template)
    turn = parse_qwen3_xml(_rendered_call(tok))
    # Values are the template's raw text; the env host types scalars by the tool's signature ("3" -> 3).
    assert [(c.name, c.arguments) for c in turn.calls] == [("get_weather", {"city": "Paris", "days": "3"})]
    assert not turn.errors

    text = (
        "Two calls.\n<tool_call>\n<function=a>\n<parameter=code>\nx = 1\nprint(x)\n</parameter>\n</function>\n"
        '</tool_call>\n<tool_call>\n<function=b>\n<parameter=opts>\n{"k": [1, 2]}\n</parameter>\n</function>\n'
        "</tool_call>"
    )
    two = parse_qwen3_xml(text)
    assert [(c.name, c.arguments) for c in two.calls] == [
        ("a", {"code": "x = 1\nprint(x)"}),
        ("b", {"opts": {"k": [1, 2]}}),
    ]
    assert two.content == "Two calls." and not two.errors
    assert "unclosed" in parse_qwen3_xml("<tool_call>\n<function=a>\n").errors[0]
    assert "one <function=NAME>" in parse_qwen3_xml('<tool_call>{"name": "a"}</tool_call>').errors[0]
    stray = parse_qwen3_xml("<tool_call><function=a>stray<parameter=x>1</parameter></function></tool_call>")
    assert "outside its <parameter" in stray.errors[0]


def test_each_template_is_detected_as_its_family():
    families = {
        "qwen2_5": "hermes",
        "qwen3": "hermes",
        "llama3_1": "llama3_json",
        "llama3_2": "llama3_json",
        "qwen3_6": "qwen3_xml",
        "qwen3_5_nothink": "qwen3_xml",
    }
    assert {t: detect((TEMPLATES / f"{t}.jinja").read_text()) for t in families} == families
    assert detect(None) == "hermes"


def _after_eos(tok, messages, tools=None) -> str:
    """The template's rendering of `messages`, from just after the first assistant turn's eos on."""
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    first = [m for m in messages if m["role"] == "assistant"][0]
    upto = messages[: messages.index(first) + 1]
    before = tok.apply_chat_template(upto, tools=tools, tokenize=False)
    cut = before.rfind(tok.eos_token) + len(tok.eos_token)
    assert text[:cut] == before[:cut]
    return text[cut:]


@pytest.mark.parametrize("template", ["llama3_1", "llama3_2", "qwen3_6", "qwen3_training", "qwen2_5"])
def test_cut_segments_are_what_the_template_renders_after_the_turn(base, template):
    tok = family(base, template)
    framing = TemplateFraming(tok)  # on Qwen2.5's too, whose format (hermes) keeps its hand-written segments
    call = copy.deepcopy(CALL)
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    results = [NASTY, "", "3"]
    segments = framing.segments([{"role": "tool", "name": "get_weather", "content": r} for r in results])
    tools_after = convo + [{"role": "tool", "name": "get_weather", "content": r} for r in results]
    assert "".join(t for t, _ in segments) == _after_eos(tok, tools_after)
    env = [t for t, role in segments if role == TokenRole.ENV]
    assert len(env) == 2 and ("408" in env[0] and env[1] == "3")  # the empty result has no env segment
    if template.startswith("llama"):
        assert env[0] == json.dumps(NASTY, ensure_ascii=False)[1:-1]  # the template quotes it as JSON

    answered = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": NASTY},
    ]
    if template == "qwen3_6":  # it drops the earlier turn's empty reasoning block once a user message follows
        with pytest.raises(ValueError, match="renders an assistant turn differently"):
            framing.segments([{"role": "user", "content": NASTY}])
    else:
        user = framing.segments([{"role": "user", "content": NASTY}])
        assert "".join(t for t, _ in user) == _after_eos(tok, answered)
    if template == "qwen2_5":  # the hand-written hermes segments, character for character and role for role
        for cut, ours in [(segments, tool_response_segments(results)), (user, user_turn_segments(NASTY))]:
            assert _by_char(cut) == _by_char(ours)


def _by_char(segments):
    return [(ch, role) for text, role in segments for ch in text]


def test_a_template_that_cannot_be_cut_is_refused_with_the_reason(base):
    tok = copy.deepcopy(base)
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="does not end an assistant turn with <.im_end.>"):
        tool_format(tok, "llama3_json")
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tool_format(tok, "qwen3_xml")
    assert tool_format(tok, "auto") is HERMES
    with pytest.raises(ValueError, match="rollout.tool_format='deepseek_v3'"):
        tool_format(tok, "deepseek_v3")


def _episode(tok, turns, tools):
    """One calculator episode through the real loop, the engine scripted to answer with `turns`."""
    host = EnvHost(tool_timeout_s=5)
    envs = EnvClient([LocalHandle(host)], "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {})
    question = [{"role": "user", "content": "What is 12 * 34?"}]
    prompt = tok.apply_chat_template(question, tools=tools, add_generation_prompt=True, return_dict=False)
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=96, max_total_tokens=4096)

    async def go():
        await envs.create([("k", {})])
        ep, fmt = Episode("k", "p", 0, list(prompt), prompt_len=len(prompt)), tool_format(tok)
        engine, stops = ScriptedEngine(tok, turns), fmt.stop_token_ids(tok)
        kw = dict(temperature=1.0, seed=0, stop_token_ids=stops, timings=RolloutTimings(), fmt=fmt)
        await run_episodes([ep], engine, envs, tok, cfg, **kw)
        return ep

    return question, prompt, asyncio.run(go())


@pytest.mark.parametrize(
    "template, call",
    [
        ("llama3_2", '{"name": "calculator", "parameters": {"expression": "12 * 34"}}'),
        (  # its generation prompt closes an empty reasoning block: the turn is the call
            "qwen3_5_nothink",
            "<tool_call>\n<function=calculator>\n<parameter=expression>\n12 * 34\n</parameter>\n</function>\n"
            "</tool_call>",
        ),
    ],
)
def test_an_episode_is_token_for_token_the_templates_rendering_of_its_messages(base, template, call):
    tok = family(base, template)
    tools = tool_schemas(CalculatorEnv)
    answer = "The answer is 408."
    question, prompt, ep = _episode(tok, [call + tok.eos_token, answer + tok.eos_token], tools)
    assert ep.finish_reason == "answer" and ep.num_tool_calls == 1 and ep.num_tool_errors == 0
    assistant, result, final = ep.messages
    assert assistant["tool_calls"][0]["function"]["name"] == "calculator" and result["content"] == "408"
    assert tok.decode([i for i, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV]) == "408"
    # The template's rendering of the same conversation, as a chat client would send it after the episode.
    rendered = tok.apply_chat_template(question + ep.messages, tools=tools, tokenize=False)
    assert tok.decode(ep.ids, skip_special_tokens=False) == rendered[: len(tok.decode(ep.ids))]
    assert rendered.startswith(tok.decode(ep.ids)) and rendered[len(tok.decode(ep.ids)) :].strip() == ""
    ids = tok.apply_chat_template(question + ep.messages, tools=tools, return_dict=False)
    assert ep.ids == ids[: len(ep.ids)]  # token for token


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}, "n": {"type": "integer"}}},
        },
    }
]
TRANSCRIPTS = {
    "llama3_2": [
        '{"name": "f", "parameters": {"x": "a", "n": 3}}',
        '<|python_tag|>{"name": "f", "parameters": {"x": "a b"}}; {"name": "g", "parameters": {}}',
        '{"name": "f", "arguments": {"x": "\\"quoted\\"", "n": -1}}',
        "The answer is 408.",
    ],
    "qwen3_6": [
        "<tool_call>\n<function=f>\n<parameter=x>\nline1\nline2\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
        "</function>\n</tool_call>",
        "Two.\n<tool_call>\n<function=f>\n<parameter=x>\na\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=g>\n</function>\n</tool_call>",
        "The answer is 408.",
    ],
    "qwen2_5": [
        'ok <tool_call>\n{"name": "f", "arguments": {"x": "a", "n": 2}}\n</tool_call>',
        "The answer is 408.",
    ],
}


@pytest.mark.slow  # vLLM's imports: ~20 s
def test_the_parsers_read_what_vllms_own_parsers_read(base):
    """The same transcripts through vLLM's `llama3_json`, `qwen3_coder` and `hermes` parsers (what its server
    answers a chat client with) and ours: the same calls, names and arguments (vLLM's qwen3 parser types values by
    the tools' schema, as our env host does by the tool's signature)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
    from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser
    from vllm.tool_parsers.qwen3_engine_tool_parser import Qwen3EngineToolParser

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS)
    parsers = {"llama3_2": Llama3JsonToolParser, "qwen3_6": Qwen3EngineToolParser, "qwen2_5": Hermes2ProToolParser}
    for template, texts in TRANSCRIPTS.items():
        tok = family(base, template)
        theirs_parser = parsers[template](tok, TOOLS) if template == "qwen3_6" else parsers[template](tok)
        ours_parser = tool_format(tok)
        for text in texts:
            theirs = theirs_parser.extract_tool_calls(text, request)
            ours = ours_parser.parse(text)
            typed = [(c.name, {k: int(v) if k == "n" else v for k, v in c.arguments.items()}) for c in ours.calls]
            expected = [(c.function.name, json.loads(c.function.arguments)) for c in theirs.tool_calls]
            assert typed == expected, (template, text)
            assert not ours.errors
            if not theirs.tools_called:
                assert ours.content == theirs.content.strip()
