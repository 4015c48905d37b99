"""`rollout.backend` -> the engine class (`rollout/engine.py` is the interface they share). Each backend is imported
on use, so a run on one never imports the other's library."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl_ray.config import ModelConfig, RolloutConfig
    from agentrl_ray.rollout.engine import Engine
    from agentrl_ray.rollout.engine_modes import EngineModes

BACKENDS = ("vllm", "torch")


def engine_class(backend: str):
    """The class of `rollout.backend`."""
    if backend == "vllm":
        from agentrl_ray.rollout.vllm_engine import VLLMEngine

        return VLLMEngine
    if backend == "torch":
        from agentrl_ray.rollout.torch_engine import TorchEngine

        return TorchEngine
    raise ValueError(f"rollout.backend={backend!r}: choose one of {', '.join(BACKENDS)}")


def make_engine(
    backend: str,
    model_path: str,
    model_cfg: ModelConfig,
    cfg: RolloutConfig,
    *,
    seed: int,
    use_gpu: bool,
    modes: EngineModes,
    kv_sequences: int,
) -> Engine:
    """The engine of one rollout worker. `kv_sequences`: the most sequences one rollout call runs at once."""
    return engine_class(backend).from_config(
        model_path, model_cfg, cfg, seed=seed, use_gpu=use_gpu, modes=modes, kv_sequences=kv_sequences
    )


def engine_process_env(backend: str, *, use_gpu: bool) -> dict[str, str]:
    """Environment variables of an engine's process, set when it starts (Ray's `runtime_env`)."""
    return engine_class(backend).process_env(use_gpu=use_gpu)
