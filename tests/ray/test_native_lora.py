"""vLLM-native LoRA (rollout.lora_mode=native) on vLLM CPU: only the adapter travels, the engine serves it as a new
LoRARequest per version (no merged copy of the model), and generates like the merged peft model, version after
version. The default on GPU engines (tests/gpu/test_gpu_suite.py::test_lora_adapter_sync runs it on CUDA)."""

import time

import pytest
import torch

from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.policy import lora_tensors
from agentrl_ray.rollout.pool import RolloutPool
from agentrl_ray.sync.sender import ObjectStoreSender

pytestmark = pytest.mark.integration


def test_native_lora_sync_matches_the_merged_model(local_ray, builtin_model_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = ["profile=lora", "rollout.lora_mode=native", "learner.lora.r=4", "learner.lora.alpha=8"]
    cfg = load_config(None, [*overrides, "rollout.num_cpus_per_worker=1"])
    pool = RolloutPool.create(cfg, builtin_model_path)
    try:
        tok = AutoTokenizer.from_pretrained(builtin_model_path)
        base = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=cfg.learner.lora.target_modules))
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "What is 77 * 3?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        sync = ObjectStoreSender(lora_scaling=8 / 4)
        sync.setup(pool.workers)
        before = pool.greedy([prompt], 16)[0][0][0]
        for version, seed in ((1, 3), (2, 4)):  # two versions: the second must replace the first
            torch.manual_seed(seed)
            for name, p in model.named_parameters():
                if "lora_" in name:
                    torch.nn.init.normal_(p, std=0.3)
            sync.push(lora_tensors(model), version)
            t0 = time.perf_counter()
            sync.flush()
            print(f"native LoRA sync v{version}: {time.perf_counter() - t0:.3f}s")
            expected = _greedy(model, prompt, 16)
            assert expected != before  # the adapter changes what the model says
            ((tokens, logprobs),) = pool.greedy([prompt], 16)[0]
            assert tokens == expected
            assert pool.versions() == [version]
    finally:
        pool.shutdown()


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
