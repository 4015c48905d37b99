"""Learner options without Ray: the DeepSpeed config we build (offload, pass-through), their validation, and
gradient checkpointing on the built-in model (it really recomputes, and leaves the gradients as they were)."""

import pytest
import torch

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.levers.zero import deepspeed_config, inference_config

DS = ["profile=cpu", "learner.backend=deepspeed"]


def test_deepspeed_config_carries_the_learner_keys():
    cfg = load_config(None, [*DS, "learner.zero_stage=3", "learner.micro_batch_size=8", "learner.lr=3e-5"])
    ds = deepspeed_config(cfg.learner)
    assert ds["zero_optimization"] == {"stage": 3}
    assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_accumulation_steps"] == 1
    assert ds["optimizer"]["params"]["lr"] == 3e-5
    assert ds["bf16"] == {"enabled": False}  # CPU trains in float32


def test_offload_and_pass_through_reach_the_deepspeed_config():
    cfg = load_config(
        None,
        [
            *DS,
            "learner.zero_stage=3",
            "learner.offload_optimizer=true",
            "learner.offload_params=true",
            "learner.deepspeed_config.zero_optimization.stage3_prefetch_bucket_size=1000",
            "learner.deepspeed_config.zero_optimization.offload_param.buffer_count=4",
            "learner.deepspeed_config.wall_clock_breakdown=true",
        ],
    )
    zero = deepspeed_config(cfg.learner)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    # The pass-through merges key by key: ours stays where it is not overridden.
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False, "buffer_count": 4}
    assert zero["stage3_prefetch_bucket_size"] == 1000
    assert deepspeed_config(cfg.learner)["wall_clock_breakdown"] is True
    assert cfg.learner.deepspeed_config["zero_optimization"] == {
        "stage3_prefetch_bucket_size": 1000,
        "offload_param": {"buffer_count": 4},
    }  # building the DeepSpeed config did not write into the user's
    ref = inference_config(deepspeed_config(cfg.learner))  # the frozen KL reference: no optimizer anywhere
    assert "optimizer" not in ref and "offload_optimizer" not in ref["zero_optimization"]
    assert ref["zero_optimization"]["offload_param"]["device"] == "cpu"


def test_gpu_offload_pins_host_memory():
    cfg = load_config(None, ["profile=gpu", "learner.zero_stage=3", "learner.offload_optimizer=true"])
    ds = deepspeed_config(cfg.learner)
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert ds["bf16"] == {"enabled": True}


def test_deepspeed_learners_use_torch_fused_adamw_unless_offloaded_or_overridden():
    """On a GPU and on a CPU DeepSpeed gets torch's fused AdamW (no nvcc or g++ build at start); offloaded
    optimizers keep DeepSpeed's CPU Adam; the pass-through can bring FusedAdam back."""

    def params(*overrides):
        return deepspeed_config(load_config(None, ["profile=gpu", *overrides]).learner)["optimizer"]["params"]

    assert params()["torch_adam"] is True and params()["fused"] is True
    assert "torch_adam" not in params("learner.zero_stage=3", "learner.offload_optimizer=true")
    cpu = deepspeed_config(load_config(None, DS).learner)["optimizer"]["params"]
    assert cpu["torch_adam"] is True and cpu["fused"] is True
    fused_adam = params("learner.deepspeed_config.optimizer.params.torch_adam=false")
    assert fused_adam["torch_adam"] is False and "fused" not in fused_adam  # FusedAdam takes no `fused`
    assert "torch_adam" not in params("learner.deepspeed_config.optimizer.type=Lamb")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["learner.backend=ddp", "learner.offload_optimizer=true"], "learner.offload_optimizer needs learner.backend"),
        (["learner.backend=ddp", "learner.deepspeed_config.x=1"], "learner.deepspeed_config needs learner.backend"),
        ([*DS, "learner.zero_stage=2", "learner.offload_params=true"], "learner.offload_params needs learner.zero_st"),
        ([*DS, "learner.zero_stage=0", "learner.offload_optimizer=true"], "offload_optimizer needs learner.zero_stage"),
        ([*DS, "learner.deepspeed_config.zero_optimization.stage=1"], "must not differ from learner.zero_stage"),
        ([*DS, "learner.deepspeed_config.train_batch_size=64"], "deepspeed_config.train_batch_size is set by"),
    ],
)
def test_impossible_learner_options_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["profile=cpu", *overrides])


def test_gradient_checkpointing_recomputes_and_keeps_gradients(builtin_model_path):
    from transformers import AutoModelForCausalLM

    from agentrl_ray.learner.policy import enable_gradient_checkpointing

    ids = torch.randint(10, 300, (2, 24))

    def grads_and_layer_calls(checkpointing: bool):
        model = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)
        if checkpointing:
            enable_gradient_checkpointing(model)
        calls = []
        # A pre-hook: the recomputation stops as soon as it has the saved tensors, before the layer's end.
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}, len(calls)

    plain, plain_calls = grads_and_layer_calls(False)
    ckpt, ckpt_calls = grads_and_layer_calls(True)
    assert (plain_calls, ckpt_calls) == (1, 2)  # the layer ran again in the backward pass
    for name, grad in plain.items():
        torch.testing.assert_close(ckpt[name], grad, rtol=1e-5, atol=1e-6, msg=name)
