"""GPU tier: vLLM CUDA rollouts, DeepSpeed ZeRO-2 learner, NCCL weight sync. Skipped without a CUDA device.

Run on a GPU machine:  pytest tests/gpu -m gpu
"""

import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_gpu_profile_trains_and_syncs(local_ray, builtin_model_path, tmp_path):
    from agentrl_ray.driver import train
    from agentrl_ray.infra.profiles import load_config

    cfg = load_config(
        None,
        [
            "profile=gpu",
            "rollout.prompts_per_step=8",
            "rollout.group_size=4",
            "data.eval_size=16",
            "run.steps=3",
            "run.eval_every=0",
            f"run.output_dir={tmp_path}",
            "run.name=gpu",
        ],
    )
    assert cfg.learner.backend == "deepspeed" and cfg.sync.transport == "collective"
    metrics = train(cfg)
    records = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records][-1] == 3
    assert metrics["samples"] == 3 * 8 * 4
