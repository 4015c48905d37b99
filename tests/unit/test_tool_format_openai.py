"""gpt-oss's tool calls (`rollout.tool_format=openai`, harmony: agentrl_ray/rollout/harmony.py), against the chat
template TRL ships (`trl/chat_templates/gptoss.jinja`, gpt-oss's own) on the built-in tokenizer with harmony's special
tokens added, and against openai_harmony, OpenAI's renderer of the format:
- the parser reads what the template and openai_harmony render for a turn (reasoning, then a call or an answer; the
  recipient in either header), and turns malformed turns into errors;
- the results are cut from the template after the call's <|call|>, the function's name in their header; the
  template writes a final answer's <|return|> as <|end|> once a message follows, so user turns are refused;
- through the real loop, every turn's prompt is token for token the template's rendering of the messages so far;
- the parser reads what vLLM's own (`openai`: HarmonyParser) reads on the same transcripts (slow: vLLM's imports).
"""

import json

import pytest
from test_tool_format import NASTY, TEMPLATES, TOOLS, _episode, each_is_one_error

from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.rollout.harmony import parse_harmony
from agentrl_ray.rollout.tool_format import detect, tool_format
from agentrl_ray.types import TokenRole

HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


@pytest.fixture(scope="module")
def gptoss(builtin_model_path):
    """The built-in tokenizer speaking gpt-oss's template, harmony's tokens single tokens, <|return|> its eos."""
    from agentrl_ray.builtin.tokenizer import load_tokenizer

    tok = load_tokenizer(builtin_model_path)
    tok.chat_template = (TEMPLATES / "gptoss.jinja").read_text()
    tok.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS})
    tok.add_special_tokens({"eos_token": "<|return|>"})
    return tok


def _harmony(*messages) -> str:
    """What openai_harmony renders for an assistant turn of `messages`, after the generation prompt."""
    from openai_harmony import (
        Conversation,
        HarmonyEncodingName,
        Message,
        RenderConversationConfig,
        Role,
        load_harmony_encoding,
    )

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    user = Message.from_role_and_content(Role.USER, "q")
    prompt = enc.decode(enc.render_conversation_for_completion(Conversation.from_messages([user]), Role.ASSISTANT))
    whole = RenderConversationConfig(auto_drop_analysis=False)  # the turn as sampled, its reasoning included
    full = enc.decode(enc.render_conversation(Conversation.from_messages([user, *messages]), whole))
    assert full.startswith(prompt)
    return full[len(prompt) :]


def test_the_parser_reads_the_template_and_harmony_and_malformed_turns_are_errors(gptoss):
    from openai_harmony import Message, Role

    head = gptoss.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "thinking": "Look it up.", "tool_calls": [call]}]
    templated = gptoss.apply_chat_template(convo, tokenize=False)[len(head) :]
    think = Message.from_role_and_content(Role.ASSISTANT, "Look it up.").with_channel("analysis")
    args = Message.from_role_and_content(Role.ASSISTANT, '{"city": "Paris", "days": 3}').with_channel("commentary")
    harmony = _harmony(think, args.with_recipient("functions.get_weather").with_content_type("<|constrain|>json"))
    assert "to=functions.get_weather<|channel|>" in templated and "commentary to=functions.get_weather" in harmony
    for text in (templated, harmony):  # the recipient after the role, and after the channel
        turn = parse_harmony(text)
        assert [(c.name, c.arguments) for c in turn.calls] == [("get_weather", {"city": "Paris", "days": 3})]
        assert turn.reasoning == "Look it up." and turn.content == "" and not turn.errors

    final = Message.from_role_and_content(Role.ASSISTANT, "Sunny.").with_channel("final")
    answer = parse_harmony(_harmony(think, final))
    assert (answer.reasoning, answer.content, answer.calls, answer.errors) == ("Look it up.", "Sunny.", [], [])
    preamble = parse_harmony(
        "<|channel|>commentary<|message|>Checking.<|end|>"  # a preamble to the user, then the call
        "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>"
    )
    assert preamble.content == "Checking." and [c.name for c in preamble.calls] == ["f"]
    assert parse_harmony("The answer is 408.").content == "The answer is 408."  # no markup: plain content
    malformed = {
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": <|call|>': "not valid JSON",
        "<|channel|>commentary to=functions.f json<|message|>[1]<|call|>": "must be a JSON object, got list",
        '<|channel|>commentary to=browser.search<|message|>{"q": 1}<|call|>': "not a function tool",
        "<|channel|>commentary to=functions.f json<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>x": (
            "text after a tool call"
        ),
        "<|channel|>final<|message|>a<|end|><|start|>user<|message|>b<|end|>": "assistant messages only",
        "<|channel|>final<|message|>a<|end|>stray": "text after <|end|>",
        "<|channel|>thoughts<|message|>a<|end|>": "no known channel",
    }
    each_is_one_error(parse_harmony, malformed)


def test_the_templates_are_detected_and_a_call_stops_the_turn(gptoss):
    assert {detect((TEMPLATES / f"{t}.jinja").read_text()) for t in ("gptoss", "gptoss_training")} == {"openai"}
    fmt = tool_format(gptoss)
    assert fmt.name == "openai" and gptoss.convert_ids_to_tokens(fmt.stop_token_ids(gptoss)) == [
        "<|return|>",
        "<|call|>",
    ]


def test_results_are_cut_from_the_template_after_the_call_and_user_turns_are_refused(gptoss):
    fmt = tool_format(gptoss)
    calls = [{"id": "call_0_0", "type": "function", "function": {"name": "get_weather", "arguments": {}}}]
    segments = fmt.tool_response_segments([NASTY, ""], calls)
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    before = gptoss.apply_chat_template(convo, tokenize=False)
    results = [{"role": "tool", "content": r} for r in (NASTY, "")]
    after = gptoss.apply_chat_template(convo + results, tokenize=False, add_generation_prompt=True)
    assert before.endswith("<|call|>") and after.startswith(before)
    assert "".join(t for t, _ in segments) == after[len(before) :]
    assert after[len(before) :].startswith("<|start|>functions.get_weather to=assistant<|channel|>commentary")
    assert [t for t, role in segments if role == TokenRole.ENV] == [json.dumps(NASTY, ensure_ascii=False)[1:-1]]
    assert "'<|return|>' becomes '<|end|>" in fmt.framing.user_turns
    with pytest.raises(ValueError, match="a user message after a turn"):
        fmt.user_turn_segments("more")


def test_an_episodes_every_prompt_is_token_for_token_the_templates_rendering(gptoss):
    """Reasoning, then a call, then reasoning and an answer. At each turn the model is shown, token for token, what
    the template renders for the messages so far; once the final answer follows, the template drops the reasoning
    of the turn that called (harmony drops an earlier turn's analysis then), and only that."""
    tools = tool_schemas(CalculatorEnv)
    think = "<|channel|>analysis<|message|>Multiply.<|end|><|start|>assistant"
    call = think + ' to=functions.calculator<|channel|>commentary json<|message|>{"expression": "12 * 34"}<|call|>'
    answer = TRANSCRIPTS[3]
    question, prompt, ep = _episode(gptoss, [call, answer], tools)
    assert ep.finish_reason == "answer" and ep.num_tool_calls == 1 and ep.num_tool_errors == 0
    assistant, result, final = ep.messages
    assert assistant["thinking"] == "Multiply." and final["thinking"] == "It is 408."
    assert final["content"] == "The answer is 408." and result["content"] == "408"
    assert gptoss.decode([i for i, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV]) == "408"
    for turn, shown in zip(ep.turns, ([], ep.messages[:2])):
        kw = dict(tools=tools, add_generation_prompt=True, return_dict=False)
        assert turn.prompt == list(gptoss.apply_chat_template(question + shown, **kw))
    whole = gptoss.apply_chat_template(question + ep.messages, tools=tools, tokenize=False)
    assert gptoss.decode(ep.ids, skip_special_tokens=False).replace(think, "", 1) == whole


TRANSCRIPTS = [
    "<|channel|>analysis<|message|>Look it up.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": "a", "n": 3}<|call|>',
    ' to=functions.f<|channel|>commentary json<|message|>{"x": "a b"}<|call|>',
    "<|channel|>commentary<|message|>Checking.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
    "<|channel|>analysis<|message|>It is 408.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is 408.<|return|>",
    "<|channel|>final<|message|>The answer is 408.",
]


@pytest.mark.slow  # vLLM's imports: ~20 s
def test_the_parser_reads_what_vllms_harmony_parser_reads(gptoss):
    """The same transcripts through vLLM's `openai` tool parser (its HarmonyParser, on openai_harmony's tokens: what
    its server answers a chat client with) and ours: the same calls, content and reasoning. Where they part on
    purpose: a call followed by more text, or to a tool outside `functions.`, is an error here (vLLM reads a second
    call, or drops it)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding
    from vllm.parser.parser_manager import ParserManager

    parser = ParserManager.get_parser(
        tool_parser_name="openai", reasoning_parser_name="openai_gptoss", is_harmony=True, enable_auto_tools=True
    )
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS)
    for text in TRANSCRIPTS:
        ids = get_encoding().encode(text, allowed_special="all")
        reasoning, content, calls = parser(gptoss, TOOLS).parse(text, request, model_output_token_ids=ids)
        ours = parse_harmony(text)
        assert [(c.name, c.arguments) for c in ours.calls] == [(c.name, json.loads(c.arguments)) for c in calls or []]
        assert (ours.reasoning, ours.content) == (reasoning or "", content or ""), text
        assert not ours.errors
