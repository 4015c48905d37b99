"""The long-tail workload's example as a user types it (`agentrl-ray train examples/longtail/config.yaml`, the
installed console script, from the repository root): sessions of several questions run turn after turn through the
environment's log-normal waits, and the step's time shows where it went (`benchmarks/run.py rollout --mode
pipeline_timeline` reads these fields)."""

import json
from pathlib import Path

import pytest
from builders import as_a_user

pytestmark = pytest.mark.long
ROOT = Path(__file__).resolve().parents[2]


def test_the_longtail_example_runs_multi_question_sessions(tmp_path):
    as_a_user(
        [
            "agentrl-ray",
            "train",
            "examples/longtail/config.yaml",
            "run.steps=2",
            "run.rollout_sample_groups=16",
            f"run.output_dir={tmp_path}",
        ],
        ROOT,
    )
    run = tmp_path / "longtail"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["step"] > 0] == [1, 2]
    for r in records[1:]:
        assert r["time/env_s"] > 0 and r["time/generate_s"] > 0 and r["integrity/failures"] == 0
    sampled = [json.loads(x) for x in (run / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    asked = [sum(m["role"] == "user" for m in s["completion"]) + 1 for s in sampled]  # the first question is the prompt
    sessions = [len(s["columns"]["questions"]) for s in sampled]
    assert max(sessions) > 1 and max(asked) > 1  # a session went past its first question
    assert all(a <= k for a, k in zip(asked, sessions))
