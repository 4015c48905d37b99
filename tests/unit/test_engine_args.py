"""rollout.engine_kwargs: vLLM engine arguments we do not wrap pass through; a typo or a key the config already
sets fails with a clear message before the engine starts (checked against vLLM's own EngineArgs fields)."""

import pytest

from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.vllm_engine import check_engine_kwargs


def test_unwrapped_engine_arguments_pass():
    check_engine_kwargs({"enable_sleep_mode": True, "kv_cache_dtype": "auto"}, {"model": "m"})


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"gpu_mem_util": 0.5}, "gpu_mem_util is not a vLLM engine argument .did you mean gpu_memory_utilization"),
        ({"model": "other"}, "engine_kwargs.model: set through the config already"),
    ],
)
def test_bad_engine_arguments_are_named(extra, message):
    with pytest.raises(ValueError, match=message):
        check_engine_kwargs(extra, {"model": "m"})


def test_engine_kwargs_is_a_config_mapping():
    cfg = load_config(None, ["profile=cpu", "rollout.engine_kwargs={enable_sleep_mode: true}"])
    assert cfg.rollout.engine_kwargs == {"enable_sleep_mode": True}
