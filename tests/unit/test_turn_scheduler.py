"""The streaming pipeline's engine side (rollout/turn_scheduler.py, `run_episodes_streaming`): requests waiting at
the same moment share one batched engine call; a weight update takes the engine between two calls, and the turns
after it carry the new version; the streaming loop builds the same tokens as the batch loop; a slow environment
delays only its own episode."""

import asyncio
import time

import pytest

from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost, ToolResult
from agentrl_ray.rollout.agent_loop import Episode, run_episodes, run_episodes_streaming
from agentrl_ray.rollout.continuity import Turn, continuity_break, token_versions
from agentrl_ray.rollout.engine import Generation
from agentrl_ray.rollout.turn_scheduler import TurnScheduler
from agentrl_ray.types import RolloutTimings, TokenRole
from tests.unit.test_agent_loop import CALL, LocalHandle, ScriptedEngine


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


class CountingEngine:
    """Answers every prompt with its length as the one token; records each batched call's size."""

    def __init__(self, delay_s: float = 0.0):
        self.batches: list[int] = []
        self.delay_s = delay_s

    def generate(self, prompts, max_tokens, **_):
        self.batches.append(len(prompts))
        time.sleep(self.delay_s)
        return [Generation([len(p)], [-1.0], "stop") for p in prompts]


def test_requests_waiting_together_share_one_engine_call_and_updates_land_between_calls():
    engine = CountingEngine(delay_s=0.05)
    version = {"v": 3}

    async def go():
        scheduler = TurnScheduler(engine, lambda: version["v"])
        opts = dict(temperature=1.0, top_p=1.0, stop_token_ids=[0])
        first = asyncio.create_task(scheduler.generate([1], 4, seed=0, **opts))
        await asyncio.sleep(0.01)  # its call is running: the next requests wait for the next call, together

        async def update():
            async with scheduler.exclusive():
                version["v"] = 4

        load = asyncio.create_task(update())
        rest = [asyncio.create_task(scheduler.generate([1] * n, 4, seed=n, **opts)) for n in range(2, 9)]
        return await first, await asyncio.gather(*rest), await load

    first, rest, _ = asyncio.run(go())
    assert first[0].token_ids == [1] and [g.token_ids for g, _ in rest] == [[n] for n in range(2, 9)]
    # The first request ran alone on version 3; the update took the engine at the next boundary, before the seven
    # requests that had queued meanwhile, which then went in one call on version 4.
    assert engine.batches == [1, 7]
    assert first[1] == 3 and [v for _, v in rest] == [4] * 7


def test_token_versions_follow_the_turn_that_sampled_them():
    turns = [Turn([1, 2], [3, 4], [-1.0, -1.0], version=5), Turn([1, 2, 3, 4, 9], [7], [-1.0], version=6)]
    assert token_versions(turns, 6) == [-1, -1, 5, 5, -1, 6]
    assert token_versions([Turn([1], [2], [-1.0])], 2) == []  # not recorded: the batch loop's endpoint path


def _episodes(tok, envs, n):
    prompt = tok.encode(
        "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    return [Episode(f"k{i}", "p", i, list(prompt), prompt_len=len(prompt)) for i in range(n)]


def _loop_args(tok):
    return dict(temperature=1.0, seed=0, stop_token_ids=[tok.eos_token_id], timings=RolloutTimings())


def test_the_streaming_loop_builds_the_batch_loops_tokens(tok):
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_total_tokens=400)
    host = EnvHost(tool_timeout_s=5)
    envs = EnvClient([LocalHandle(host)], "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {})
    turns = [CALL, "The answer is 408.<|im_end|>"]

    async def go():
        batch, stream = _episodes(tok, envs, 2), _episodes(tok, envs, 2)
        for ep in stream:
            ep.key += "s"
        await envs.create([(e.key, {}) for e in batch + stream])
        await run_episodes(batch, ScriptedEngine(tok, turns), envs, tok, cfg, version=2, **_loop_args(tok))
        scheduler = TurnScheduler(ScriptedEngine(tok, turns), lambda: 2)  # replays its turns call by call
        await run_episodes_streaming(stream[:1], scheduler, envs, tok, cfg, **_loop_args(tok))
        return batch, stream[0]

    batch, streamed = asyncio.run(go())
    ref = batch[0]
    assert streamed.ids == ref.ids and streamed.roles == ref.roles and streamed.logprobs == ref.logprobs
    assert streamed.finish_reason == ref.finish_reason == "answer" and streamed.messages == ref.messages
    assert [t.version for t in streamed.turns] == [2, 2] == [t.version for t in ref.turns]
    mask = [int(r == TokenRole.ACTION) for r in streamed.roles]
    assert continuity_break(streamed.turns, streamed.ids, mask, streamed.logprobs) == ""


class SlowFirstEnv:
    """An environment client whose episode k0 waits `slow_s` on each tool call; the others answer at once."""

    def __init__(self, slow_s: float):
        self.slow_s = slow_s
        self.answered: list[tuple[str, float]] = []

    async def call_tools(self, requests):
        key = requests[0][0]
        if key == "k0":
            await asyncio.sleep(self.slow_s)
        self.answered.append((key, time.perf_counter()))
        return [[ToolResult("408", False)]]


def test_a_slow_environment_delays_only_its_own_episode(tok):
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=64, max_total_tokens=400)
    envs = SlowFirstEnv(slow_s=0.5)
    engine = ScriptedEngine(tok, [CALL])  # every turn calls the tool: 4 turns, 3 tool calls each

    async def go():
        episodes = _episodes(tok, envs, 4)
        t0 = time.perf_counter()
        await run_episodes_streaming(episodes, TurnScheduler(engine, lambda: 0), envs, tok, cfg, **_loop_args(tok))
        return episodes, t0

    episodes, t0 = asyncio.run(go())
    assert all(e.finish_reason == "max_turns" and len(e.turns) == 4 for e in episodes)
    fast_done = max(t for k, t in envs.answered if k != "k0") - t0
    slow_done = max(t for k, t in envs.answered if k == "k0") - t0
    # Batch loop: every turn waits for k0's 0.5 s tool, so the fast episodes' third call would come after >= 1.0 s.
    assert fast_done < 0.5 <= 1.5 <= slow_done, (fast_done, slow_done)
