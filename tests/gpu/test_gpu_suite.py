"""GPU tier: the CPU tests' checks on CUDA. Skipped without a CUDA device (and a test needing two GPUs without two).

Run on a GPU machine (README):  python -m pytest tests/gpu -m gpu -v

Each test trains the built-in model for 2 steps with engines the test keeps, then checks that every engine holds
exactly the weights the learner saved (greedy tokens equal, log-probabilities within 1e-3 while the weights moved
further than that from the base model), like tests/ray/test_zero3.py. Engines run in float32 so that vLLM's CUDA
kernels and transformers agree token for token; the learner trains in DeepSpeed's bf16 (its saved weights are bf16,
the engines receive them cast to float32, and the reference loads the same bf16 files as float32).
- 1 GPU, colocated: an engine and the learner rank share the GPU (fractional Ray GPUs, the 1-GPU plan), the engine
  asleep (vLLM sleep mode, level 1) while the learner steps; a separate test measures the memory sleep frees.
- 2 GPUs, separate: engine and learner on their own GPUs, weights over NCCL (sync.transport=collective).
- ZeRO-3 on 2 GPUs: partitioned model, gathered sync and save, DeepSpeed's reconstruction equals the HF folder.
- LoRA: adapter-only sync into vLLM's own LoRA support (a LoRARequest per version, rollout.lora_mode=auto on GPU),
  the engine equals the merged peft model.
- QLoRA: the learner's base in NF4 (bitsandbytes CUDA), the engine's in full precision, the same equality.
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
    from agentrl_ray.driver import train
    from agentrl_ray.infra.profiles import load_config
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
        # sleep_mode=always: the plan's auto would choose it for this layout; this pool is made without a plan.
        ["placement.mode=colocated", "learner.num_workers=1", "sync.transport=object_store"]
        + ["rollout.sleep_mode=always"],
        builtin_model_path,
        tmp_path,
        "colocated",
    )


def test_engine_sleeps_between_rollouts_and_wakes_with_its_weights(local_ray, builtin_model_path):
    """Sleep mode frees the engine's GPU memory (KV cache, weights to CPU) after a rollout; the next use wakes it with
    the same weights (greedy tokens equal)."""
    from transformers import AutoTokenizer

    from agentrl_ray.data import load_rows
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.rollout.pool import RolloutPool

    cfg = load_config(None, [*BASE, "rollout.sleep_mode=always", "rollout.gpu_memory_utilization=0.3"])
    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 7?"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    rows = load_rows(cfg.data.train, cfg.data, split="train", size=4)
    pool = RolloutPool.create(cfg, builtin_model_path)
    try:
        awake = pool.greedy([prompt], 8)[0][0][0]
        free_awake = torch.cuda.mem_get_info()[0]
        groups, _ = pool.sample(rows, 2, 1.0, seed=0)  # the engine sleeps when the rollout ends
        assert len(groups) == 4
        free_asleep = torch.cuda.mem_get_info()[0]
        total = torch.cuda.mem_get_info()[1]
        print(f"sleep freed {(free_asleep - free_awake) / 2**30:.2f} GiB of {total / 2**30:.0f} GiB")
        assert free_asleep - free_awake > 0.1 * total  # most of the 30% it held (KV cache + weights)
        assert pool.greedy([prompt], 8)[0][0][0] == awake  # woken by the call, weights back from CPU memory
        groups, _ = pool.sample(rows, 2, 1.0, seed=1)
        assert len(groups) == 4
    finally:
        pool.shutdown()


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
    overrides += ["placement.mode=colocated", "rollout.sleep_mode=always"]  # native LoRA through sleep/wake
    cfg, metrics, pool = _train_and_keep_engines(overrides, builtin_model_path, tmp_path, "lora")
    try:
        adapter = cfg.run_dir / "checkpoint_000002" / "adapter"
        merged = PeftModel.from_pretrained(load_hf(Path(builtin_model_path), "cuda"), adapter).merge_and_unload()
        assert_engines_hold(pool, merged.eval(), load_hf(Path(builtin_model_path), "cuda"), tok)
    finally:
        pool.shutdown()


def test_qlora_trains_an_nf4_base_and_the_engines_get_the_adapter(local_ray, builtin_model_path, tmp_path):
    """learner.lora.quantize=nf4 on CUDA: the learner's base in 4-bit (bitsandbytes' CUDA kernels), the engine's in
    full precision; after 2 steps the engine equals the saved adapter merged into the full-precision base."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    overrides = ["profile=lora", "learner.use_gpu=true", "rollout.use_gpu=true", "learner.lora.r=4"]
    overrides += ["learner.lora.quantize=nf4", "learner.backend=ddp"]
    cfg, metrics, pool = _train_and_keep_engines(overrides, builtin_model_path, tmp_path, "qlora")
    try:
        assert metrics["samples"] == 2 * 4 * 4
        adapter = cfg.run_dir / "checkpoint_000002" / "adapter"
        merged = PeftModel.from_pretrained(load_hf(Path(builtin_model_path), "cuda"), adapter).merge_and_unload()
        assert_engines_hold(pool, merged.eval(), load_hf(Path(builtin_model_path), "cuda"), tok)
    finally:
        pool.shutdown()
