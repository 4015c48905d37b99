"""`learner.skip_zero_gradient_rows`: the learner's real `update()` on two DDP ranks of a Ray Train TorchTrainer
(gloo), once computing every row and once only the rows with a gradient, from the same weights. The weights after
each step must agree (float rounding aside: the micro-batches hold other rows), on a step whose groups are mostly
solved and on one whose groups all are (the optimizer must still step: AdamW's momentum moves the weights)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
import ray.train
import torch

from agentrl_ray.infra.profiles import load_config
from agentrl_ray.infra.ray_train import ProcessGroupConfig, loop_config, torch_trainer
from agentrl_ray.types import Trajectory, TrajectoryGroup

pytestmark = pytest.mark.long


def _traj(prompt: str, index: int, reward: float) -> Trajectory:
    """A 4-token prompt of its group, then 5 action tokens of its own."""
    ids = [(11 * len(prompt) + 3 * k) % 50 + 5 for k in range(4)] + [(7 * index + 5 * k) % 50 + 5 for k in range(5)]
    return Trajectory(
        prompt_id=prompt,
        sample_index=index,
        token_ids=ids,
        action_mask=[0] * 4 + [1] * 5,
        env_mask=[0] * 9,
        template_mask=[0] * 9,
        rollout_logprobs=[0.0] * 4 + [-3.0 - 0.1 * k for k in range(5)],
        reward=reward,
        policy_version=0,
        finish_reason="answer",
        prompt_len=4,
    )


def _steps() -> list[list[TrajectoryGroup]]:
    solved = [TrajectoryGroup(p, [_traj(p, i, 1.0) for i in range(4)]) for p in ("aa", "bbb", "cccc")]
    varied = TrajectoryGroup("d", [_traj("d", i, float(i % 2)) for i in range(4)])
    return [[*solved[:2], varied, solved[2]], solved]  # step 0: 4 rows of 16 with a gradient; step 1: none


def _ranks(config):  # pickled by value: Ray Train's workers cannot import this test
    import torch.distributed as dist

    from agentrl_ray.infra.ray_train import loop_inputs
    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.learner.update import update

    inputs = loop_inputs(config)
    weights, counts = {}, {}
    for skip in (False, True):
        cfg = load_config(None, [*inputs["overrides"], f"learner.skip_zero_gradient_rows={str(skip).lower()}"])
        torch.manual_seed(0)
        policy = Policy(inputs["model_path"], cfg.model, cfg.learner, need_reference=False)
        trained = [n for n, p in policy.module.named_parameters() if p.requires_grad]
        for step, groups in enumerate(inputs["steps"]):
            metrics = update(policy, groups, cfg, step=step, pad_id=0)
            params = dict(policy.module.named_parameters())
            weights[skip, step] = {n: params[n].detach().clone() for n in trained}
            counts[skip, step] = metrics["loss/zero_gradient_rows"]
    gap = {
        step: max(float((weights[True, step][n] - weights[False, step][n]).abs().max()) for n in trained)
        for step in (0, 1)
    }
    moved = {
        step: max(float((weights[False, step][n] - weights[False, step - 1][n]).abs().max()) for n in trained)
        for step in (1,)
    }
    out = {"gap": gap, "moved": moved, "counts": {f"{k[0]}-{k[1]}": v for k, v in counts.items()}}
    out["world"] = dist.get_world_size()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "out.json").write_text(json.dumps(out))
        ray.train.report({"done": 1}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def test_skipping_the_rows_without_a_gradient_trains_the_same_weights(local_ray, builtin_model_path, tmp_path):
    overrides = ["learner.micro_batch_size=2", "learner.lr=0.01", "learner.compile=false"]
    inputs = {"overrides": overrides, "model_path": builtin_model_path, "steps": _steps()}
    trainer = torch_trainer()(
        _ranks,
        train_loop_config=loop_config(inputs),
        torch_config=ProcessGroupConfig(backend="gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path), name="zero-gradient-rows"),
    )
    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)
    try:
        result = trainer.fit()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)
    assert result.error is None
    with result.checkpoint.as_directory() as d:
        out = json.loads(Path(d, "out.json").read_text())
    assert out["world"] == 2
    assert out["counts"] == {"False-0": 12, "True-0": 12, "False-1": 12, "True-1": 12}
    assert out["moved"]["1"] > 1e-4  # step 1 has no gradient, yet AdamW's momentum moves the weights
    assert out["gap"]["0"] < 1e-5 and out["gap"]["1"] < 1e-5, out["gap"]
