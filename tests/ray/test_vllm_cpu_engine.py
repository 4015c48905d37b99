"""What our vLLM CPU engine does beyond vLLM's defaults, in a real engine in a Ray worker as the rollout pool runs it.

- A group's copies of one prompt, generated in one call, prefill the prompt's whole KV blocks once. vLLM's prefix
  cache shares only whole blocks; at vLLM CPU's default block of 128 tokens a prompt shorter than that shares nothing
  and each of the G copies prefills it again. Our CPU engine uses 32-token blocks (`engine.CPU_BLOCK_SIZE`).
- Random sampling inverts the CDF at one uniform from the request's seed (`rollout/sampling.py`), as the torch engine
  does: both pick the token that the model's probabilities and the seed give.
"""

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from agentrl_ray.rollout.sampling import inverse_cdf
from agentrl_ray.rollout.torch_engine import TorchEngine
from agentrl_ray.rollout.vllm_engine import CPU_BLOCK_SIZE, vllm_env


@ray.remote(num_cpus=1, runtime_env={"env_vars": vllm_env(use_gpu=False)})
def _prefill(model_path: str, prompt: list[int], copies: int, engine_kwargs: dict) -> tuple[int, list[int]]:
    """The engine's block size and each copy's prompt tokens served from the prefix cache."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from agentrl_ray.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        model_path,
        dtype="float32",
        seed=0,
        max_model_len=256,
        max_num_seqs=copies,
        enforce_eager=True,
        gpu_memory_utilization=0.9,
        use_gpu=False,
        kv_cache_bytes=16 * 2**20,
        engine_kwargs=engine_kwargs,
    )
    outs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=prompt)] * copies, SamplingParams(max_tokens=1), use_tqdm=False
    )
    return engine.llm.llm_engine.vllm_config.cache_config.block_size, [o.num_cached_tokens for o in outs]


@pytest.mark.long
def test_copies_of_a_prompt_share_its_whole_blocks(local_ray, builtin_model_path):
    prompt = [(7 * i) % 300 + 10 for i in range(70)]  # two whole 32-token blocks and 6 tokens
    block, cached = ray.get(_prefill.remote(builtin_model_path, prompt, 4, {}))
    assert block == CPU_BLOCK_SIZE == 32
    # The first copy computes the blocks; the three others are served them.
    assert sorted(cached) == [0, 64, 64, 64]


@pytest.mark.long
def test_a_block_size_in_engine_kwargs_wins(local_ray, builtin_model_path):
    """The user's `rollout.engine_kwargs.block_size` replaces ours: at 128 the 70-token prompt shares nothing."""
    prompt = [(7 * i) % 300 + 10 for i in range(70)]
    block, cached = ray.get(_prefill.remote(builtin_model_path, prompt, 4, {"block_size": 128}))
    assert block == 128
    assert cached == [0, 0, 0, 0]


@ray.remote(num_cpus=1, runtime_env={"env_vars": vllm_env(use_gpu=False)})
def _first_tokens(model_path: str, prompt: list[int], seeds: list[int], temperature: float) -> list[int]:
    """The first sampled token of each seeded copy of `prompt`, all in one call."""
    from agentrl_ray.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        model_path,
        dtype="float32",
        seed=0,
        max_model_len=256,
        max_num_seqs=len(seeds),
        enforce_eager=True,
        gpu_memory_utilization=0.9,
        use_gpu=False,
        kv_cache_bytes=16 * 2**20,
    )
    gens = engine.generate(
        [prompt] * len(seeds), [1] * len(seeds), temperature=temperature, top_p=1.0, stop_token_ids=[], seeds=seeds
    )
    return [g.token_ids[0] for g in gens]


@pytest.mark.integration
def test_sampling_inverts_the_cdf_at_the_seeds_uniform_like_the_torch_engine(local_ray, builtin_model_path):
    prompt = [(13 * i) % 200 + 5 for i in range(9)]  # the built-in model's next token is uncertain here
    seeds, temperature = list(range(300)), 1.5
    vllm_tokens = ray.get(_first_tokens.remote(builtin_model_path, prompt, seeds, temperature))

    model = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)  # (V,)
    uniforms = torch.cat(
        [torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds]
    )
    expected = inverse_cdf(probs.expand(len(seeds), -1), uniforms).tolist()
    assert len(set(expected)) >= 5  # a spread distribution: agreement is no fluke of one likely token
    # Two float32 forward passes may differ in the last bits; a draw at a CDF boundary may then fall either way.
    assert sum(a == b for a, b in zip(vllm_tokens, expected)) >= 0.99 * len(seeds)

    engine = TorchEngine(builtin_model_path, dtype="float32", seed=0, max_model_len=64, max_num_seqs=len(seeds))
    gens = engine.generate(
        [prompt] * len(seeds), [1] * len(seeds), temperature=temperature, top_p=1.0, stop_token_ids=[], seeds=seeds
    )
    assert sum(g.token_ids[0] == b for g, b in zip(gens, vllm_tokens)) >= 0.99 * len(seeds)
