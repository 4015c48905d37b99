"""Built-in rewards, loading by name or import path, and weighted scoring with failure reporting."""

import asyncio
import logging
import math

import pytest

from agentrl_ray.rewards import answer_match, final_answer_text, load_reward_functions, score

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def _episode(final: str) -> list[dict]:
    return [
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": final},
    ]


def test_answer_match_reads_last_number_of_final_answer():
    completions = [
        _episode("The answer is 5."),
        _episode("The answer is 5.0000001."),  # within 1e-6 relative
        _episode("The answer is 5.01."),
        _episode("I am not sure."),
        _episode(CALL),  # still calling tools: no final answer
        "-12.5",  # a plain-string completion is one assistant message
        _episode("1,000"),
    ]
    answers = ["5", 5, "5", "5", "5", "-12.5", "1000"]
    assert answer_match(completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_answer_match_bad_expected_never_matches():
    assert answer_match([_episode("5")], answer=[None]) == [0.0]
    assert answer_match([_episode("5")], answer=["five"]) == [0.0]


def test_final_answer_text():
    assert final_answer_text(_episode("Done: 5")) == "Done: 5"
    assert final_answer_text(_episode(CALL)) is None
    assert final_answer_text([{"role": "tool", "content": "5"}]) is None


def test_load_reward_functions_by_name_and_path():
    funcs = load_reward_functions(["answer_match", "agentrl_ray.rewards.builtin:answer_match"])
    assert funcs == [answer_match, answer_match]
    with pytest.raises(ValueError, match="unknown reward function 'nope'.*answer_match"):
        load_reward_functions(["nope"])
    with pytest.raises(ImportError, match="no_such_module"):
        load_reward_functions(["no_such_module:f"])
    with pytest.raises(TypeError, match="not callable"):
        load_reward_functions(["agentrl_ray.rewards.scoring:BUILTIN"])


def test_score_weights_parts_and_trl_call_convention():
    seen = {}

    def length_bonus(completions, prompts, **kwargs):
        seen.update(kwargs, prompts=prompts)
        return [0.5 * len(c) for c in completions]

    completions = [_episode("5"), _episode("6")]
    columns = {"prompt": ["p0", "p1"], "answer": ["5", "5"], "id": [0, 1]}
    totals, parts = score(
        [answer_match, length_bonus], [1.0, 0.2], completions, columns, episode_stats=[{}, {}], env_rewards=[None, 1.0]
    )
    assert totals == pytest.approx([1.0 + 0.2 * 1.5, 0.2 * 1.5])
    assert parts == [{"answer_match": 1.0, "length_bonus": 1.5}, {"answer_match": 0.0, "length_bonus": 1.5}]
    # As in TRL: prompts come as `prompts`, the `prompt` column is withheld, other columns and extras pass through.
    assert seen["prompts"] == ["p0", "p1"] and "prompt" not in seen
    assert seen["id"] == [0, 1] and seen["env_rewards"] == [None, 1.0] and seen["episode_stats"] == [{}, {}]


def test_score_failures_are_zero_and_reported(caplog):
    def raises(completions, **kwargs):
        raise RuntimeError("judge down")

    def short(completions, **kwargs):
        return [1.0]

    def partly_bad(completions, **kwargs):
        return [float("nan"), "high", 2.0]

    def abstains(completions, **kwargs):
        return [None, 1.0, None]

    completions = [_episode("1"), _episode("2"), _episode("3")]
    with caplog.at_level(logging.WARNING):
        totals, parts = score([raises, short, partly_bad, abstains], [1.0] * 4, completions, {"answer": [1, 2, 3]})
    assert totals == [0.0, 1.0, 2.0]
    assert parts[0] == {
        "raises": 0.0,
        "raises/error": 1.0,
        "short": 0.0,
        "short/error": 1.0,
        "partly_bad": 0.0,
        "partly_bad/error": 1.0,
        "abstains": 0.0,
        "abstains/none": 1.0,
    }
    assert parts[1]["partly_bad/error"] == 1.0 and parts[1]["abstains"] == 1.0
    assert "partly_bad/error" not in parts[2] and parts[2]["partly_bad"] == 2.0
    logged = caplog.text
    assert "'raises' raised RuntimeError: judge down" in logged
    assert "'short' returned 1 values for 3 samples" in logged
    assert "'partly_bad' returned 2 non-numeric or NaN/inf values" in logged


def test_score_runs_async_reward_inside_a_running_loop():
    async def judge(completions, **kwargs):
        await asyncio.sleep(0)
        return [0.25] * len(completions)

    async def from_actor():  # the rollout worker calls score from inside its event loop
        return score([judge], [2.0], [_episode("1")], {})

    totals, parts = asyncio.run(from_actor())
    assert totals == [0.5] and parts == [{"judge": 0.25}]


def test_score_checks_its_inputs():
    with pytest.raises(ValueError, match="1 reward functions but 2 weights"):
        score([answer_match], [1.0, 1.0], [], {})
    with pytest.raises(ValueError, match="column 'answer' has 1 values for 2"):
        score([answer_match], [1.0], [[], []], {"answer": [1]})
    with pytest.raises(ValueError, match="collide"):
        score([answer_match], [1.0], [[]], {"env_rewards": [1]}, env_rewards=[None])


def test_numpy_like_reals_are_accepted():
    class Real(float):
        pass

    totals, _ = score([lambda completions, **kw: [Real(0.5)]], [1.0], [[]], {})
    assert totals == [0.5] and not math.isnan(totals[0])
