"""A CPU engine's KV cache is sized to the run: room for the sequences one rollout call sends it at the run's whole
token budget (vLLM CPU holds the whole cache resident, so a fixed GiB was ~1 GiB of the tiny run's memory)."""

import pytest
from transformers import LlamaConfig, Qwen2Config

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.pool import sequences_per_engine
from agentrl_ray.rollout.vllm_engine import kv_bytes_per_token, kv_cache_bytes

MiB = 2**20


@pytest.fixture
def qwen_folder(tmp_path):
    Qwen2Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3).save_pretrained(
        tmp_path
    )
    return str(tmp_path)


def test_bytes_per_token_follow_layers_kv_heads_and_dtype(qwen_folder, tmp_path):
    # K and V x 3 layers x 2 KV heads x head_dim 32
    assert kv_bytes_per_token(qwen_folder, "float32") == 2 * 3 * 2 * 32 * 4
    assert kv_bytes_per_token(qwen_folder, "bfloat16") == 2 * 3 * 2 * 32 * 2
    mha = tmp_path / "mha"
    LlamaConfig(hidden_size=64, num_attention_heads=2, num_hidden_layers=1, head_dim=48).save_pretrained(mha)
    assert kv_bytes_per_token(str(mha), "float16") == 2 * 1 * 2 * 48 * 2  # explicit head_dim, no GQA


def test_cache_holds_the_sequences_rounded_up_to_whole_mib(qwen_folder):
    per_token = kv_bytes_per_token(qwen_folder, "float32")
    size = kv_cache_bytes(qwen_folder, dtype="float32", gib=0, sequences=256, tokens=2000)
    assert size % MiB == 0
    assert size - MiB < 256 * 2000 * per_token <= size


def test_small_runs_get_the_floor_and_an_explicit_size_wins(qwen_folder):
    assert kv_cache_bytes(qwen_folder, dtype="bfloat16", gib=0, sequences=1, tokens=16) == 16 * MiB
    assert kv_cache_bytes(qwen_folder, dtype="bfloat16", gib=0.25, sequences=256, tokens=10**6) == 2**28


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # a step's 16 x 8 samples, but the held-out evaluation sends 200 rows x 2 samples: capped at max_num_seqs
        ([], 256),
        (["rollout.num_workers=2", "data.eval_size=10"], 8 * 8),  # 16 prompts over 2 engines x group 8
        (["rollout.num_workers=3", "data.eval_size=90", "run.eval_samples=4"], 30 * 4),  # the evaluation is larger
        (["rollout.max_num_seqs=32"], 32),
    ],
)
def test_sequences_per_engine(overrides, expected):
    cfg = load_config(None, ["profile=cpu", "rollout.prompts_per_step=16", "rollout.group_size=8", *overrides])
    assert sequences_per_engine(cfg) == expected


def test_negative_size_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="rollout.kv_cache_gib must be >= 0"):
        load_config(None, ["rollout.kv_cache_gib=-1"])
