"""Deadlines of remote waits, derived from the config (agentrl_ray/deadlines.py), and their config checks."""

from __future__ import annotations

import pytest

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.deadlines import Deadlines


def test_a_rollout_deadline_bounds_every_turn_of_generation_and_tools():
    cfg = load_config(
        None,
        [
            "profile=cpu",
            "rollout.max_turns=3",
            "rollout.max_tokens_per_turn=40",
            "rollout.max_num_seqs=64",
            "env.tool_timeout_s=5",
            "recovery.decode_step_s=0.5",
            "recovery.slack_s=30",
        ],
    )
    d = Deadlines.of(cfg)
    turn = 40 * 0.5 + 5  # a turn's decode steps for one wave of sequences, then its tool calls
    fixed = 3 * 5 + 30  # reset, rewards and close, one tool timeout each, and the slack
    assert d.rollout_s(64) == pytest.approx(3 * turn + fixed)
    assert d.rollout_s(1) == d.rollout_s(64)  # one wave either way
    assert d.rollout_s(65) == pytest.approx(3 * 2 * turn + fixed)  # a second wave of sequences waits for the first
    assert d.probe_s == pytest.approx(40 * 0.5 + 30)  # an engine's event loop is busy for one generate call at most
    assert d.actor_start_s == cfg.recovery.actor_start_s


def test_longer_turns_get_longer_deadlines():
    short = Deadlines.of(load_config(None, ["profile=cpu", "rollout.max_tokens_per_turn=16"]))
    long = Deadlines.of(load_config(None, ["profile=cpu", "rollout.max_tokens_per_turn=64"]))
    assert long.rollout_s(8) > short.rollout_s(8)


@pytest.mark.parametrize(
    "override, key",
    [
        ("recovery.max_actor_restarts=-1", "recovery.max_actor_restarts"),
        ("recovery.decode_step_s=0", "recovery: deadlines"),
        ("recovery.actor_start_s=-5", "recovery: deadlines"),
    ],
)
def test_impossible_recovery_settings_fail_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, ["profile=cpu", override])
