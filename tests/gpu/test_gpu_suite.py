"""GPU tier: the CPU tests' checks on CUDA. Skipped without a CUDA device (and a test needing two GPUs without two).

Run on a GPU machine (README):  python -m pytest tests/gpu -m gpu -v

Each test trains the built-in model for 2 steps with engines the test keeps, then checks that every engine holds
exactly the weights the learner saved (greedy tokens equal, log-probabilities within 1e-3 while the weights moved
further than that from the base model), like tests/ray/test_zero3.py. Engines run in float32 so that vLLM's CUDA
kernels and transformers agree token for token; the learner trains in DeepSpeed's bf16 (its saved weights are bf16,
the engines receive them cast to float32, and the reference loads the same bf16 files as float32).
- 1 GPU, colocated: an engine and the learner rank share the GPU (fractional Ray GPUs, the 1-GPU plan).
- 2 GPUs, separate: engine and learner on their own GPUs, weights over NCCL (sync.transport=collective).
- ZeRO-3 on 2 GPUs: partitioned model, gathered sync and save, DeepSpeed's reconstruction equals the HF folder.
- LoRA: adapter-only sync, the engine equals the merged peft model.
"""

from pathlib import Path

import pytest
import torch
from engine_checks import assert_engines_hold, load_hf
from safetensors.torch import load_file

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")]
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")

BASE = [
    "profile=gpu",
    "model.dtype=float32",
    "rollout.num_workers=1",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "data.train_size=64",
    "data.eval_size=16",
    "run.eval_samples=2",
    "run.eval_every=0",
    "run.eval_at_start=false",
    "run.steps=2",
    "run.checkpoint_every=0",
    "learner.lr=1e-2",
]


def _train_and_keep_engines(overrides: list[str], model_path: str, tmp_path: Path, name: str):
    """Train with a RolloutPool the test owns; returns (cfg, metrics, pool) - the caller shuts the pool down."""
    from agentrl_ray.config import load_config
    from agentrl_ray.driver import train
    from agentrl_ray.rollout.pool import RolloutPool

    cfg = load_config(None, [*BASE, *overrides, f"run.output_dir={tmp_path}", f"run.name={name}"])
    pool = RolloutPool.create(cfg, model_path)
    try:
        metrics = train(cfg, pool=pool)
    except BaseException:
        pool.shutdown()
        raise
    return cfg, metrics, pool


def _check_full_model_run(overrides, builtin_model_path, tmp_path, name) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    cfg, metrics, pool = _train_and_keep_engines(overrides, builtin_model_path, tmp_path, name)
    folder = cfg.run_dir / "checkpoint_000002" / "model"
    try:
        assert metrics["samples"] == 2 * 4 * 4
        assert_engines_hold(pool, load_hf(folder, "cuda"), load_hf(Path(builtin_model_path), "cuda"), tok)
    finally:
        pool.shutdown()
    return folder


def test_one_gpu_colocated(local_ray, builtin_model_path, tmp_path):
    _check_full_model_run(
        # NCCL cannot put two ranks of one group on the same GPU: colocated weights go through the object store.
        ["placement.mode=colocated", "learner.num_workers=1", "sync.transport=object_store"],
        builtin_model_path,
        tmp_path,
        "colocated",
    )


@two_gpus
def test_two_gpus_separate_nccl_sync(local_ray, builtin_model_path, tmp_path):
    _check_full_model_run(
        ["placement.mode=separate", "learner.num_workers=1", "sync.transport=collective"],
        builtin_model_path,
        tmp_path,
        "separate",
    )


@two_gpus
def test_zero3_two_gpus(local_ray, builtin_model_path, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    folder = _check_full_model_run(
        [
            "placement.mode=colocated",
            "learner.num_workers=2",
            "learner.backend=deepspeed",
            "learner.zero_stage=3",
            "learner.deepspeed_config.zero_optimization.stage3_param_persistence_threshold=0",
            "sync.transport=object_store",  # colocated: the engine shares rank 0's GPU (see test_one_gpu_colocated)
        ],
        builtin_model_path,
        tmp_path,
        "zero3",
    )
    saved = load_file(str(next(folder.glob("*.safetensors"))))
    assert saved and all(v.numel() > 0 for v in saved.values())
    # The HF folder holds the gathered bf16 weights; DeepSpeed's fp32 masters round to exactly them.
    masters = get_fp32_state_dict_from_zero_checkpoint(str(folder.parent / "deepspeed"), tag="state")
    for name, tensor in saved.items():
        assert torch.equal(tensor, masters[name].to(tensor.dtype)), name


def test_lora_adapter_sync(local_ray, builtin_model_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    overrides = ["profile=lora", "learner.use_gpu=true", "rollout.use_gpu=true", "learner.lora.r=4"]
    overrides += ["placement.mode=colocated"]
    cfg, metrics, pool = _train_and_keep_engines(overrides, builtin_model_path, tmp_path, "lora")
    try:
        adapter = cfg.run_dir / "checkpoint_000002" / "adapter"
        merged = PeftModel.from_pretrained(load_hf(Path(builtin_model_path), "cuda"), adapter).merge_and_unload()
        assert_engines_hold(pool, merged.eval(), load_hf(Path(builtin_model_path), "cuda"), tok)
    finally:
        pool.shutdown()
