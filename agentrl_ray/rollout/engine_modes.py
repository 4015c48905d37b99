"""Two engine settings that follow from the config and the placement mode, decided in one pure function.

- sleep: the engine sleeps (vLLM sleep mode, level 1: weights copied to CPU memory, KV cache freed; the torch
  backend: weights to CPU memory, its cache is per call anyway) from the end
  of each rollout until the next one, so a learner rank that shares its GPU gets that memory for its step. It wakes
  before anything else touches it: the next rollout (whose pending weights it then loads), a weight push, a greedy
  check. Worth it only when they share a GPU (`placement.mode=colocated`) and take turns: with
  `sync.max_staleness=1` the rollout of step t+1 runs while step t trains, so there is no idle engine to put to
  sleep. Both backends sleep on accelerators only: on CPU `rollout.sleep_mode=always` is refused.
- lora_rank: > 0 (the adapter's rank) builds the engine with vLLM's own LoRA support (`enable_lora`, with the
  smallest `max_lora_rank` vLLM accepts that holds it: `vllm_engine.vllm_lora_rank`); each sync then hands the
  engine the adapter, which it applies as a new `LoRARequest` (a new id per version), instead of merging the adapter
  into the base weights (read again from the model folder at each update) on CPU. On by default on GPU engines;
  vLLM CPU supports it too (`rollout.lora_mode=native`), the CPU default stays the merge. The torch backend always
  merges (its engine holds plain `transformers` weights): `rollout.lora_mode=native` with it is refused by the
  config.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl_ray.config import Config


@dataclass(frozen=True)
class EngineModes:
    sleep: bool = False
    """Sleep (level 1) between rollouts, wake up before the next use."""
    lora_rank: int = 0
    """The adapter's rank for the engine's native LoRA; 0: full weights, or LoRA merged on the receiving side."""
    stream: bool = False
    """The streaming pipeline (sync.pipeline=stream): the worker takes many rollout calls at once and batches their
    turns (rollout/turn_scheduler.py)."""


def engine_modes(cfg: Config, placement_mode: str | None) -> EngineModes:
    """`placement_mode`: the plan's mode ("cpu", "separate", "colocated"), None without a plan (an engine pool made
    by hand, as tests do): then only an explicit `rollout.sleep_mode=always` sleeps."""
    r = cfg.rollout
    if r.sleep_mode == "auto":
        sleep = r.use_gpu and placement_mode == "colocated" and cfg.sync.max_staleness == 0
    else:
        sleep = r.sleep_mode == "always"
    lora = cfg.learner.lora
    native = r.backend == "vllm" and (r.lora_mode == "native" or (r.lora_mode == "auto" and lora.enabled and r.use_gpu))
    return EngineModes(
        sleep=sleep, lora_rank=lora.r if native and lora.enabled else 0, stream=cfg.sync.pipeline == "stream"
    )
