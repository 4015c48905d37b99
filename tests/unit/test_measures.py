"""Part-2 built-in rewards (format, tool success, efficiency, env reward) and measures adapted into rewards."""

import pytest

from agentrl_ray.rewards import (
    as_reward,
    count_tool_calls,
    efficiency_reward,
    ends_with_answer,
    load_reward_functions,
    measure_reward,
    no_malformed_tool_calls,
    score,
    split_samples,
    tool_calls_succeeded,
    tool_success,
)

GOOD_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
BAD_CALL = "<tool_call>\n{oops\n</tool_call>"


def _episode(*turns: tuple[str, str]) -> list[dict]:
    return [{"role": role, "content": content} for role, content in turns]


CLEAN = _episode(("assistant", GOOD_CALL), ("tool", "5"), ("assistant", "It is 5."))
FAILED_TOOL = _episode(("assistant", GOOD_CALL + GOOD_CALL), ("tool", "5"), ("tool", "Error: boom"), ("assistant", "5"))
MALFORMED = _episode(("assistant", BAD_CALL), ("tool", "Error: could not parse"), ("assistant", "5"))
CUT_OFF = _episode(("assistant", GOOD_CALL), ("tool", "5"), ("assistant", GOOD_CALL))
NO_TOOLS = _episode(("assistant", "5"))


def test_format_reward_gives_partial_credit():
    (fmt,) = load_reward_functions(["format"])
    # MALFORMED: one of its two assistant turns is malformed (score 0.5) and it ends with an answer (1): 0.75.
    assert fmt([CLEAN, MALFORMED, CUT_OFF, _episode(("assistant", BAD_CALL))]) == [1.0, 0.75, 0.5, 0.0]
    verdicts = fmt.explain(MALFORMED)
    assert verdicts[0]["measure"] == "no_malformed_tool_calls" and not verdicts[0]["passed"]
    assert verdicts[0]["score"] == 0.5 and "turn 0: tool call is not valid JSON" in verdicts[0]["reason"]
    assert verdicts[1] == {"measure": "ends_with_answer", "passed": True, "score": 1.0, "reason": ""}


def test_format_reward_uses_finish_reason_when_given():
    (fmt,) = load_reward_functions(["format"])
    trajs = [{"finish_reason": "length", "num_tool_calls": 1, "num_tool_errors": 0, "num_tokens": 9}]
    assert fmt([CLEAN], episode_stats=trajs) == [0.5]
    assert ends_with_answer(CLEAN, stats=trajs[0]) == {
        "passed": False,
        "score": 0.0,
        "reason": "episode ended by 'length', not by an answer",
    }


def test_count_tool_calls_from_messages_and_from_episode_stats():
    assert count_tool_calls(CLEAN) == (1, 0)
    assert count_tool_calls(FAILED_TOOL) == (2, 1)
    assert count_tool_calls(MALFORMED) == (1, 1)
    assert count_tool_calls(NO_TOOLS, {"num_tool_calls": 3, "num_tool_errors": 2}) == (3, 2)


def test_tool_success_rate_and_abstention():
    assert tool_success([CLEAN, FAILED_TOOL, MALFORMED, NO_TOOLS]) == [1.0, 0.5, 0.0, None]
    totals, parts = score([tool_success], [1.0], [NO_TOOLS], {})
    assert totals == [0.0] and parts == [{"tool_success": 0.0, "tool_success/none": 1.0}]


def test_efficiency_from_episode_stats_or_completion_ids():
    eff = efficiency_reward(token_budget=100, tool_call_budget=4)
    trajs = [
        {"num_tokens": 0, "num_tool_calls": 0, "num_tool_errors": 0},
        {"num_tokens": 50, "num_tool_calls": 2, "num_tool_errors": 0},
        {"num_tokens": 400, "num_tool_calls": 9, "num_tool_errors": 0},
    ]
    assert eff([NO_TOOLS] * 3, episode_stats=trajs) == pytest.approx([1.0, 0.5, 0.0])
    assert eff([CLEAN], completion_ids=[[1] * 25]) == pytest.approx([1 - 0.125 - 0.125])
    with pytest.raises(ValueError, match="needs token counts"):
        eff([CLEAN])
    with pytest.raises(ValueError, match="must be positive"):
        efficiency_reward(token_budget=0)


def test_env_reward_passes_through_and_none_or_nan_are_reported():
    (env,) = load_reward_functions(["env_reward"])
    totals, parts = score([env], [2.0], [NO_TOOLS] * 3, {}, env_rewards=[1.0, None, float("nan")])
    assert totals == [2.0, 0.0, 0.0]
    assert parts[1] == {"env_reward": 0.0, "env_reward/none": 1.0}
    assert parts[2] == {"env_reward": 0.0, "env_reward/error": 1.0}


def test_split_samples_singular_names_and_shared_values():
    rows = split_samples(2, {"answer": ["1", "2"], "episode_stats": [{"a": 1}, {"a": 2}], "trainer_state": "S"})
    assert rows == [
        {"answer": "1", "stats": {"a": 1}, "trainer_state": "S"},
        {"answer": "2", "stats": {"a": 2}, "trainer_state": "S"},
    ]


def test_measure_decorator_and_custom_measures():
    @measure_reward
    def mentions_source(completion, source, **sample):
        text = completion[-1]["content"]
        return source in text, "" if source in text else f"no mention of {source!r}"

    completions = [_episode(("assistant", "per Euler")), _episode(("assistant", "trust me"))]
    assert mentions_source.__name__ == "mentions_source"
    assert mentions_source(completions, source=["Euler", "Gauss"]) == [1.0, 0.0]
    assert mentions_source.explain(completions[1], source="Gauss") == [
        {"measure": "mentions_source", "passed": False, "score": 0.0, "reason": "no mention of 'Gauss'"}
    ]


def test_as_reward_all_or_nothing_and_bad_measure_is_an_error():
    strict = as_reward(no_malformed_tool_calls, tool_calls_succeeded, partial=False)
    assert strict.__name__ == "no_malformed_tool_calls+tool_calls_succeeded"
    assert strict([CLEAN, FAILED_TOOL, MALFORMED]) == [1.0, 0.0, 0.0]

    def sloppy(completion, **sample):
        return 1.0  # not a verdict

    bad = as_reward(sloppy)
    with pytest.raises(TypeError, match="sloppy.*must return .'passed': bool"):
        bad([CLEAN])

    def overscored(completion, **sample):
        return {"passed": False, "score": 1.5}

    with pytest.raises(ValueError, match="overscored.*outside"):
        as_reward(overscored)([CLEAN])
    totals, parts = score([bad], [1.0], [CLEAN], {})
    assert totals == [0.0] and parts[0]["sloppy/error"] == 1.0
    with pytest.raises(ValueError, match="at least one measure"):
        as_reward()


def test_partial_credit_from_scores_and_pass_fail_values():
    """A measure's score is its credit when it fails; pass/fail values set the reward's range."""

    def digits_right(completion, answer, **sample):
        text = completion[-1]["content"]
        right = sum(a == b for a, b in zip(text, answer)) / len(answer)
        return {"passed": text == answer, "score": right, "reason": f"{right:.0%} of digits right"}

    completions = [_episode(("assistant", "1234")), _episode(("assistant", "1299")), _episode(("assistant", "x"))]
    answers = ["1234"] * 3
    assert as_reward(digits_right)(completions, answer=answers) == [1.0, 0.5, 0.0]
    assert as_reward(digits_right, pass_value=1.0, fail_value=-1.0)(completions, answer=answers) == [1.0, 0.0, -1.0]
    assert as_reward(digits_right, partial=False, fail_value=-0.5)(completions, answer=answers) == [1.0, -0.5, -0.5]
    assert tool_calls_succeeded(FAILED_TOOL)["score"] == 0.5
