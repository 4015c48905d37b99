"""Token bookkeeping of the multi-turn loop: ids are exactly prompt + sampled + encoded tool segments, each tagged
with its role, and budgets end episodes with the right finish reason.

The engine here is scripted (it replays fixed turns, so the expected ids are known); the environment is the real
EnvHost with the real calculator, called in-process. The real vLLM engine is exercised in tests/ray.
"""

import asyncio

import pytest

from agentrl_ray.chat_format import encode_segments, tool_response_segments
from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.rollout.agent_loop import Episode, run_episodes
from agentrl_ray.rollout.engine import Generation
from agentrl_ray.types import RolloutTimings, TokenRole

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call><|im_end|>'


class ScriptedEngine:
    def __init__(self, tokenizer, turns: list[str]):
        self.tok = tokenizer
        self.turns = turns
        self.calls = 0

    def generate(self, prompts, max_tokens, **_):
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        out = []
        for budget in max_tokens:
            ids = self.tok.encode(text, add_special_tokens=False)
            reason = "stop"
            if len(ids) > budget:
                ids, reason = ids[:budget], "length"
            out.append(Generation(ids, [-0.5] * len(ids), reason))
        return out


class LocalHandle:
    """Calls an in-process EnvHost the way a Ray actor handle would (`.method.remote(...)` → awaitable)."""

    def __init__(self, host):
        self.host = host

    def __getattr__(self, name):
        method = getattr(self.host, name)

        class _M:
            @staticmethod
            def remote(*a, **k):
                return method(*a, **k)

        return _M


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


def _run(tok, turns, cfg):
    host = EnvHost(tool_timeout_s=5)
    envs = EnvClient([LocalHandle(host)], "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {})
    prompt = tok.encode(
        "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )

    async def go():
        await envs.create([("k", {})])
        ep = Episode("k", "p", 0, list(prompt), prompt_len=len(prompt))
        timings = RolloutTimings()
        await run_episodes(
            [ep],
            ScriptedEngine(tok, turns),
            envs,
            tok,
            cfg,
            temperature=1.0,
            seed=0,
            stop_token_ids=[tok.eos_token_id],
            timings=timings,
        )
        return ep

    return prompt, asyncio.run(go())


def test_tool_turn_then_answer_keeps_exact_tokens_and_roles(tok):
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_total_tokens=400)
    prompt, ep = _run(tok, [CALL, "The answer is 408.<|im_end|>"], cfg)
    call_ids = tok.encode(CALL, add_special_tokens=False)
    seg_ids, seg_roles = encode_segments(tok, tool_response_segments(["408"]))
    answer_ids = tok.encode("The answer is 408.<|im_end|>", add_special_tokens=False)
    assert ep.ids == prompt + call_ids + seg_ids + answer_ids
    expected_roles = (
        [TokenRole.PROMPT] * len(prompt)
        + [TokenRole.ACTION] * len(call_ids)
        + seg_roles
        + [TokenRole.ACTION] * len(answer_ids)
    )
    assert ep.roles == expected_roles
    assert tok.decode([i for i, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV]) == "408"
    assert ep.finish_reason == "answer" and ep.num_tool_calls == 1 and ep.num_tool_errors == 0
    assert [m["role"] for m in ep.messages] == ["assistant", "tool", "assistant"]
    assert ep.logprobs[len(prompt)] == -0.5 and ep.logprobs[len(prompt) + len(call_ids)] == 0.0


def test_bad_tool_call_becomes_error_observation(tok):
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * "}}\n</tool_call><|im_end|>'
    cfg = RolloutConfig(max_turns=2, max_tokens_per_turn=64, max_total_tokens=400)
    _, ep = _run(tok, [bad, "The answer is 1.<|im_end|>"], cfg)
    assert ep.num_tool_errors == 1 and ep.messages[1]["content"].startswith("Error")
    assert ep.finish_reason == "answer"


def test_budgets_end_episodes(tok):
    # Still calling tools after max_turns.
    _, ep = _run(tok, [CALL], RolloutConfig(max_turns=2, max_tokens_per_turn=64, max_total_tokens=400))
    assert ep.finish_reason == "max_turns" and ep.num_tool_calls == 1
    # A turn cut by the per-turn budget is truncated ("length").
    _, ep = _run(tok, [CALL], RolloutConfig(max_turns=2, max_tokens_per_turn=5, max_total_tokens=400))
    assert ep.finish_reason == "length" and ep.roles.count(TokenRole.ACTION) == 5
    # No room left for the tool result.
    prompt_len = len(
        tok.encode("<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    )
    n_call = len(tok.encode(CALL, add_special_tokens=False))
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=n_call, max_total_tokens=prompt_len + n_call + 3)
    _, ep = _run(tok, [CALL], cfg)
    assert ep.finish_reason == "length" and ep.roles.count(TokenRole.ENV) == 0
