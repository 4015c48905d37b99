"""The multi-turn tool loop, tokens in and tokens out.

One `Episode` per trajectory. Every turn, all live episodes are generated together (one batched engine call, so
the engine sees the whole batch), their tool calls are sent to their own environment instances concurrently, and
the tokenized tool results are appended with role tags. The conversation is never re-tokenized: the learner
trains on exactly the ids the engine sampled, and the rollout logprobs line up with them one to one.

An episode ends with
- "answer": the policy produced a turn without tool calls (its final answer);
- "length": the token budget ran out (mid-turn, or no room for the tool result and another turn);
- "max_turns": the policy still asked for tools after `max_turns` turns.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.chat_format import encode_segments, tool_response_segments
from agentrl_ray.config import RolloutConfig
from agentrl_ray.rollout.engine import VLLMEngine
from agentrl_ray.rollout.tool_parser import parse_tool_calls

PROMPT, ACTION, ENV, TEMPLATE = 0, 1, 2, 3


@dataclass
class Episode:
    key: str  # trajectory key, also the key of its environment instance
    prompt_id: str
    sample_index: int
    env: Any  # handle of the env actor hosting this episode's environment
    ids: list[int]
    prompt_len: int
    roles: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)  # completion in TRL conversational format
    finish_reason: str = ""
    num_tool_calls: int = 0
    num_tool_errors: int = 0

    def __post_init__(self) -> None:
        self.roles = [PROMPT] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)

    def append(self, ids: list[int], role: int, logprobs: list[float] | None = None) -> None:
        self.ids.extend(ids)
        self.roles.extend([role] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


async def run_episodes(
    episodes: list[Episode],
    engine: VLLMEngine,
    tokenizer,
    cfg: RolloutConfig,
    *,
    temperature: float,
    seed: int,
    stop_token_ids: list[int],
    timings: dict[str, float],
) -> None:
    """Run every episode to its end, in place."""
    for turn in range(cfg.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            return
        t0 = time.perf_counter()
        budgets = [min(cfg.max_tokens_per_turn, cfg.max_total_tokens - len(e.ids)) for e in live]
        gens = engine.generate(
            [e.ids for e in live],
            budgets,
            temperature=temperature,
            top_p=cfg.top_p,
            stop_token_ids=stop_token_ids,
            seeds=[zlib.crc32(f"{seed}/{e.key}/{turn}".encode()) for e in live],
        )
        timings["generate_s"] += time.perf_counter() - t0

        pending: list[tuple[Episode, Any]] = []
        for ep, gen in zip(live, gens):
            ep.append(gen.token_ids, ACTION, gen.logprobs)
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            text = text.removesuffix(tokenizer.eos_token or "")
            ep.messages.append({"role": "assistant", "content": text})
            if gen.finish_reason == "length":
                ep.finish_reason = "length"
                continue
            parsed = parse_tool_calls(text)
            if not parsed.calls and not parsed.errors:
                ep.finish_reason = "answer"
                continue
            if turn == cfg.max_turns - 1:
                ep.finish_reason = "max_turns"
                continue
            ep.num_tool_calls += len(parsed.calls) + len(parsed.errors)
            pending.append((ep, ep.env.call_tools.remote(ep.key, parsed.calls, parsed.errors)))

        t0 = time.perf_counter()
        results = await asyncio.gather(*(ref for _, ref in pending))
        timings["env_s"] += time.perf_counter() - t0
        for (ep, _), tool_results in zip(pending, results):
            ep.num_tool_errors += sum(r.error for r in tool_results)
            for r in tool_results:
                ep.messages.append({"role": "tool", "content": r.text})
            ids, roles = encode_segments(tokenizer, tool_response_segments([r.text for r in tool_results]))
            # Room is needed for the tool result plus at least one generated token.
            if len(ep.ids) + len(ids) >= cfg.max_total_tokens:
                ep.finish_reason = "length"
                continue
            ep.ids.extend(ids)
            ep.roles.extend(ENV if r == "env" else TEMPLATE for r in roles)
            ep.logprobs.extend([0.0] * len(ids))
    for ep in episodes:
        if not ep.done:
            ep.finish_reason = "max_turns"
