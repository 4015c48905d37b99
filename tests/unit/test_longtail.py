"""The long-tail agent workload (tasks/longtail.py, envs/builtin/longtail.py): its rows, its heavy tails (session
length and log-normal step latency, measured on the environment's own draws) and an episode stepped through."""

from __future__ import annotations

import asyncio
import collections
import statistics

import pytest

from agentrl_ray.envs.builtin.longtail import LongTailEnv, p99_over_median
from agentrl_ray.tasks.longtail import make_longtail_rows

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'


def test_rows_are_sessions_of_one_to_four_questions_with_a_heavy_tail_and_disjoint_splits():
    train, evals = make_longtail_rows(4000, 0, "train"), make_longtail_rows(400, 0, "eval")
    assert make_longtail_rows(50, 0, "train") == train[:50]  # deterministic, a prefix of a longer draw
    counts = collections.Counter(len(r["questions"]) for r in train)
    assert set(counts) == {1, 2, 3, 4}
    assert counts[1] / 4000 == pytest.approx(0.5, abs=0.03) and counts[4] / 4000 == pytest.approx(0.125, abs=0.02)
    for r in train[:200]:
        assert r["prompt"] == [{"role": "user", "content": r["questions"][0]}] and r["answer"] == r["answers"][-1]
        a, op, b = r["questions"][0].removeprefix("What is ").removesuffix("?").split()
        assert str(eval(f"{a}{op}{b}")) == r["answers"][0]  # noqa: S307 (two integers and an operator)
    assert not {q for r in train for q in r["questions"]} & {q for r in evals for q in r["questions"]}
    assert len({r["id"] for r in train}) == len(train)


def test_step_latency_is_log_normal_with_its_p99_ten_times_its_median():
    assert p99_over_median(1.0) == pytest.approx(10.24, abs=0.01)
    env = LongTailEnv(median_s=1e-7, sigma=1.0, seed=3)  # real sleeps, too short to matter; the draws are the point
    draws = []
    for i in range(3000):
        env.reset(id=f"r{i}", questions=["What is 1 + 1?"], answers=["2"])
        asyncio.run(env.step("The answer is 2."))
        draws.append(env.waited_s / 1e-7)
    draws.sort()
    median, p99 = statistics.median(draws), draws[int(0.99 * len(draws))]
    assert median == pytest.approx(1.0, rel=0.1) and 8.0 < p99 / median < 13.0
    env.reset(id="r7", questions=["q"], answers=["1"])
    first = env.rng.random()
    env.reset(id="r7", questions=["q"], answers=["1"])
    assert env.rng.random() == first  # seeded by the row: a run's latencies repeat


def test_an_episode_runs_the_calls_scores_each_answer_and_asks_the_next_question():
    env = LongTailEnv(median_s=0.0)
    env.reset(id="s", questions=["What is 12 * 34?", "What is 905 - 17?"], answers=["408", "888"])
    observation, reward, done = asyncio.run(env.step(CALL % "12 * 34"))
    assert observation == [{"role": "tool", "content": "408"}] and reward == 0.0 and not done
    observation, reward, done = asyncio.run(env.step("The answer is 408."))
    assert observation == [{"role": "user", "content": "What is 905 - 17?"}] and reward == 0.5 and not done
    observation, reward, done = asyncio.run(env.step("It is 887."))
    assert observation is None and reward == 0.0 and done
    env.reset(id="s", questions=["What is 1 + 1?"], answers=["2"])
    (result,), _, _ = asyncio.run(env.step(CALL.replace("calculator", "search") % "x"))
    assert result["content"] == "Error: unknown tool 'search' (the only tool is calculator)"
    with pytest.raises(ValueError, match="questions` and `answers"):
        env.reset(id="bad", questions=["q"], answers=[])


def test_the_config_fits_its_longest_first_prompt_into_the_context(builtin_model_path):
    from transformers import AutoTokenizer

    from agentrl_ray.data import load_rows
    from agentrl_ray.envs.tools import tool_schemas
    from agentrl_ray.infra.profiles import load_config

    cfg = load_config("examples/longtail/config.yaml", ["profile=cpu"])
    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    rows = load_rows(cfg.data.train, cfg.data, split="train", size=cfg.data.train_size)
    tools = tool_schemas(LongTailEnv)
    assert [t["function"]["name"] for t in tools] == ["calculator"]  # the tool, inherited; step makes it turn-based
    longest = max(
        len(tok.apply_chat_template(r["prompt"], tools=tools, add_generation_prompt=True, return_dict=False))
        for r in rows[:200]
    )
    assert longest + cfg.rollout.max_tokens_per_turn * 2 <= cfg.rollout.max_total_tokens
