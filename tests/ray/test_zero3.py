"""DeepSpeed ZeRO-3 on CPU: two learner ranks over gloo, every parameter really partitioned
(`stage3_param_persistence_threshold=0`, through `learner.deepspeed_config`), a partitioned KL reference (beta > 0),
gradient checkpointing on.

One run of 2 steps (collective weight sync), then a resume to step 3 (object-store sync), each with engines the test
keeps so it can compare them with what the learner saved:
- the engines' greedy tokens and logprobs equal `transformers` on the saved HF folder (the saved and the synced
  weights come from the same gather at the same version);
- the saved HF folder loads in `transformers`, every tensor full-size and equal to DeepSpeed's own reconstruction of
  the partitions (`zero_to_fp32`, an independent reader of the optimizer's fp32 shards);
- the resume continues from the checkpoint (DeepSpeed's engine state: its step counter, and the weights it trains
  from) and the held-out environment-token CE is computed with both ranks taking part in the forwards.
"""

import json
from pathlib import Path

import pytest
import torch
from engine_checks import assert_engines_hold, load_hf
from safetensors.torch import load_file

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.pool import RolloutPool

pytestmark = pytest.mark.long

ZERO3 = [
    "profile=cpu",
    "learner.backend=deepspeed",
    "learner.zero_stage=3",
    "learner.num_workers=2",
    "learner.deepspeed_config.zero_optimization.stage3_param_persistence_threshold=0",
    "algorithm.beta=0.01",
    "learner.gradient_checkpointing=true",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "data.train_size=64",
    "data.eval_size=16",
    "run.eval_samples=2",
    "run.eval_every=0",
    "run.eval_at_start=false",
    "run.checkpoint_every=0",
    "run.keep_checkpoints=0",
    "run.name=z3",
]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _ds_step(ckpt: Path) -> int:
    # ZeRO-3 writes one model-states file per rank (zero_pp_rank_<r>_mp_rank_00_model_states.pt); rank 0's.
    (path,) = (ckpt / "deepspeed" / "state").glob("zero_pp_rank_0_*model_states.pt")
    state = torch.load(path, weights_only=False)
    return int(state["global_steps"])


def test_zero3_trains_syncs_saves_and_resumes(local_ray, builtin_model_path, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    base_model = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)
    base = _weights(Path(builtin_model_path))
    overrides = [*ZERO3, f"run.output_dir={tmp_path}"]

    cfg = load_config(None, [*overrides, "run.steps=2", "sync.transport=collective", "learner.lr=1e-2"])
    pool = RolloutPool.create(cfg, builtin_model_path)
    try:
        metrics = train(cfg, pool=pool)
        ckpt2 = cfg.run_dir / "checkpoint_000002"
        assert_engines_hold(pool, load_hf(ckpt2 / "model"), base_model, tok)
    finally:
        pool.shutdown()
    assert metrics["samples"] == 2 * 4 * 4
    assert torch.isfinite(torch.tensor(metrics["eval/echo_ce"]))  # the eval forward ran on both ranks

    saved = _weights(ckpt2 / "model")
    model, info = AutoModelForCausalLM.from_pretrained(ckpt2 / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert {k: v.shape for k, v in saved.items()} == {k: base[k].shape for k in saved}
    assert all(v.numel() > 0 for v in saved.values())
    consolidated = get_fp32_state_dict_from_zero_checkpoint(str(ckpt2 / "deepspeed"), tag="state")
    for name, tensor in saved.items():
        assert torch.equal(tensor, consolidated[name].to(tensor.dtype)), name
    assert sum(not torch.equal(base[k], v) for k, v in saved.items()) > len(saved) // 2
    assert _ds_step(ckpt2) == 2

    # Resume with a learning rate so small that step 3 leaves the weights where it found them: they must be the
    # checkpoint's (2 steps at lr 1e-2 away from the base model), restored into the partitions by DeepSpeed.
    cfg3 = load_config(None, [*overrides, "run.steps=3", "run.resume=true", "learner.lr=1e-9"])
    pool = RolloutPool.create(cfg3, builtin_model_path)
    try:
        metrics = train(cfg3, pool=pool)
        ckpt3 = cfg.run_dir / "checkpoint_000003"
        assert_engines_hold(pool, load_hf(ckpt3 / "model"), base_model, tok)
    finally:
        pool.shutdown()
    assert metrics["samples"] == 3 * 4 * 4
    assert _ds_step(ckpt3) == 3
    resumed = _weights(ckpt3 / "model")
    assert max(float((resumed[k] - saved[k]).abs().max()) for k in saved) < 1e-6
    records = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss/policy_loss"])) for r in records)
