"""A real resume after a crash tore the run directory: Ray Train's checkpoint snapshot is cut short, the latest
checkpoint's weights file is truncated and metrics.jsonl ends with half a line. The resume falls back to the newest
checkpoint that verifies and completes every step; no traceback (agentrl_ray/resume.py)."""

import json

import pytest
import torch
from builders import TINY_RUN

from agentrl_ray.driver import SNAPSHOT, train
from agentrl_ray.infra.profiles import load_config

pytestmark = pytest.mark.slow

SMALL = TINY_RUN


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_resume_after_a_torn_snapshot_checkpoint_and_metrics_line(local_ray, builtin_model_path, tmp_path):
    overrides = [*SMALL, f"run.output_dir={tmp_path}", "run.name=torn"]
    train(load_config(None, [*overrides, "run.steps=2"]))
    run_dir = tmp_path / "torn"
    _cut(run_dir / SNAPSHOT)
    _cut(run_dir / "checkpoint_000002" / "model" / "model.safetensors")
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')

    metrics = train(load_config(None, [*overrides, "run.steps=3", "run.resume=true"]))

    assert metrics["samples"] == 3 * 4 * 4  # resumed from checkpoint 1 (16 samples), then steps 2 and 3
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # the torn line cut, step 2 of the first attempt dropped and redone once
    assert len(list(run_dir.glob("checkpoint_000002.corrupt-*"))) == 1
    assert len(list(run_dir.glob(f"{SNAPSHOT}.corrupt-*"))) == 1
    state = torch.load(run_dir / "checkpoint_000003" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 3
