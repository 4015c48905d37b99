"""A group's copies of one prompt, generated in one call, prefill the prompt's whole KV blocks once.

vLLM's prefix cache shares only whole blocks; at vLLM CPU's default block of 128 tokens a prompt shorter than that
shares nothing and each of the G copies prefills it again. Our CPU engine uses 32-token blocks
(`engine.CPU_BLOCK_SIZE`). A real vLLM CPU engine in a Ray worker, as the rollout pool runs it.
"""

import pytest
import ray

from agentrl_ray.rollout.vllm_engine import CPU_BLOCK_SIZE, vllm_env

pytestmark = pytest.mark.slow


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


def test_copies_of_a_prompt_share_its_whole_blocks(local_ray, builtin_model_path):
    prompt = [(7 * i) % 300 + 10 for i in range(70)]  # two whole 32-token blocks and 6 tokens
    block, cached = ray.get(_prefill.remote(builtin_model_path, prompt, 4, {}))
    assert block == CPU_BLOCK_SIZE == 32
    # The first copy computes the blocks; the three others are served them.
    assert sorted(cached) == [0, 64, 64, 64]


def test_a_block_size_in_engine_kwargs_wins(local_ray, builtin_model_path):
    """The user's `rollout.engine_kwargs.block_size` replaces ours: at 128 the 70-token prompt shares nothing."""
    prompt = [(7 * i) % 300 + 10 for i in range(70)]
    block, cached = ray.get(_prefill.remote(builtin_model_path, prompt, 4, {"block_size": 128}))
    assert block == 128
    assert cached == [0, 0, 0, 0]
