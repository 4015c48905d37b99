"""The stream pipeline (`sync.pipeline=stream`, learner/stream.py, rollout/turn_scheduler.py) on the long-tail agent
workload, through the whole stack (vLLM engines, env actors, Ray Train learner): groups stream back while the
learner trains, weights land in the engines between two turns of episodes in flight, and every trained trajectory
stays within `sync.max_staleness` versions. One run, asserted from several angles."""

import json

import pytest

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config

pytestmark = pytest.mark.integration
K = 2


@pytest.fixture(scope="module")
def stream_run(local_ray, tmp_path_factory):
    out = tmp_path_factory.mktemp("stream")
    cfg = load_config(
        "examples/longtail/config.yaml",
        [
            "profile=cpu",
            "sync.pipeline=stream",
            f"sync.max_staleness={K}",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "run.steps=6",
            "run.save_rollouts=1",
            "run.checkpoint_every=0",
            f"run.output_dir={out}",
            "run.name=s",
        ],
    )
    train(cfg)
    run = out / "s"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rollouts = {
        step: [json.loads(x) for x in (run / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        for step in range(1, 7)
    }
    return records, rollouts


def test_every_step_trains_whole_groups_within_the_staleness_bound(stream_run):
    records, rollouts = stream_run
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        assert r["integrity/failures"] == 0 and r["integrity/policy_version/max_lag"] <= K
        assert r["rollout/groups_sampled"] == 4 + r["rollout/stale_dropped"] + r["rollout/filtered_groups"]
    for step, saved in rollouts.items():
        groups = {}
        for t in saved:
            groups.setdefault(t["prompt_id"], []).append(t["sample_index"])
            assert step - 1 - t["policy_version"] <= K  # step s trains on weights version s - 1
        assert all(sorted(g) == [0, 1, 2, 3] for g in groups.values())  # whole groups only
    # The pipeline ran ahead: later steps train on groups sampled by older weights.
    assert max(r["rollout/staleness"] for r in steps) > 0


def test_a_weight_update_lands_between_two_turns_of_an_episode_in_flight(stream_run):
    _, rollouts = stream_run
    saved = [t for step in rollouts.values() for t in step]
    assert all(t["turn_versions"] and t["policy_version"] == min(t["turn_versions"]) for t in saved)
    assert all(t["turn_versions"] == sorted(t["turn_versions"]) for t in saved)  # versions only go forward
    spanning = [t for t in saved if len(set(t["turn_versions"])) > 1]
    assert spanning, "no trajectory continued on new weights after an update"


def test_no_slot_of_the_schedule_is_trained_twice(stream_run):
    _, rollouts = stream_run
    # 6 steps x 4 prompts from one pass over the 2,000 rows: every slot's prompt is distinct, so a group trained
    # twice (or two slots given one prompt) would repeat a prompt id.
    trained = [t["prompt_id"] for step in rollouts.values() for t in step if t["sample_index"] == 0]
    assert len(trained) == len(set(trained)) == 6 * 4
