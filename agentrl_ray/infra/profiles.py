"""Hardware profiles: presets that sit under the user's YAML and overrides (the thread policy is in `threads`), and
`load_config`, which layers them.

`profile=auto` looks at the hardware the run will use (cores, RAM, GPUs) and picks `gpu` when it has GPUs, else `cpu`:
the Ray cluster this process is connected to or pointed at (RAY_ADDRESS), else this machine (`cluster_hardware`).
A Ryzen-class workstation (>= 8 cores, >= 32 GiB, no GPU) gets a larger CPU preset: more rollout workers and
learner threads. Explicit profiles:

- cpu:  vLLM CPU rollouts, full fine-tune on CPU (plain DDP over gloo), object-store weight sync;
- lora: LoRA adapters (peft) on CPU or one consumer GPU, adapter-only weight sync;
- gpu:  vLLM CUDA rollouts, DeepSpeed ZeRO-2 learner on the GPUs, collective (NCCL) weight sync; engine and
        learner counts come from the Ray cluster at start (`placement.py`), token budgets sized for real models.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from agentrl_ray.config import Config, ConfigError, config_from_dict, deep_merge, user_values
from agentrl_ray.config.checking import check_value
from agentrl_ray.config.stability import STABILITY, stability_preset
from agentrl_ray.infra.cluster_hardware import target_hardware
from agentrl_ray.infra.hardware import Hardware, detect_hardware
from agentrl_ray.infra.sizing import fit_cpu_requests

# Real models with a real tool system prompt: the prompt alone (tool schemas + instructions) is often 300-1,000
# tokens, and a tool-using answer several hundred more per turn.
GPU_TOKEN_BUDGETS = {"max_tokens_per_turn": 1024, "max_total_tokens": 8192, "max_num_seqs": 256}

__all__ = ["Hardware", "detect_hardware", "load_config", "profile_preset", "resolve_profile"]


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> Config:
    """YAML file, then nested `values` (the Python API's arguments), then dotted overrides → validated Config, with
    the profile and stability presets underneath.

    Layers, later ones winning: defaults → profile → stability preset → YAML → values → overrides. `profile=auto`
    reads the hardware the run will use once: the Ray cluster's nodes when there is one, else this machine.
    """
    user = user_values(path, overrides, values)
    requested = check_value(user.get("profile", "auto"), typing.get_type_hints(Config)["profile"], "profile")
    hardware = target_hardware()
    profile = resolve_profile(requested, hardware)
    stability = user.get("stability", "balanced")
    if stability not in STABILITY:
        raise ConfigError(f"stability: {stability!r} is not one of {', '.join(STABILITY)}")
    preset = profile_preset(profile, hardware)
    preset = deep_merge(preset, stability_preset(stability, preset))
    cfg = config_from_dict(deep_merge(preset, {**user, "profile": profile}))
    # Relative to where the command runs (Ray Train workers run in another working directory), or to a stable
    # folder inside a submitted Ray job's temporary working dir (storage.py).
    from agentrl_ray.infra.storage import resolve_path

    cfg.run.output_dir = resolve_path(cfg.run.output_dir)
    cfg.run.storage_path = resolve_path(cfg.run.storage_path)
    return cfg


def resolve_profile(requested: str, hardware: Hardware | None = None) -> str:
    if requested != "auto":
        return requested
    hardware = hardware or target_hardware()
    return "gpu" if hardware.gpus > 0 else "cpu"


def profile_preset(profile: str, hardware: Hardware | None = None) -> dict[str, Any]:
    """Nested config values for a resolved profile (never 'auto'), its Ray CPU requests sized to fit the node."""

    hardware = hardware or target_hardware()
    return fit_cpu_requests(_preset(profile, hardware), hardware.cpus)


def _preset(profile: str, hardware: Hardware) -> dict[str, Any]:
    if profile == "cpu":
        preset: dict[str, Any] = {
            "model": {"dtype": "float32"},
            "learner": {"backend": "ddp", "use_gpu": False, "num_workers": 1},
            "sync": {"transport": "object_store"},
        }
        if hardware.workstation:
            # Ryzen-class workstation: two rollout engines (four from 32 cores, so each gets 8-16 threads; not
            # measured on such a machine) and more learner threads. bf16 autocast only where the ISA computes it
            # natively (AVX512_BF16 or AMX): elsewhere it is emulated.
            preset["rollout"] = {"num_workers": 4 if hardware.cpus >= 32 else 2}
            preset["learner"].update(torch_threads=max(2, hardware.cpus // 3), bf16=hardware.cpu.bf16)
        return preset
    if profile == "lora":
        gpu = hardware.gpus > 0
        return {
            "model": {"dtype": "bfloat16" if gpu else "float32"},
            "learner": {
                "backend": "ddp",
                "use_gpu": gpu,
                "num_workers": 1,
                "lr": 1e-3,
                "lora": {"enabled": True},
            },
            # One engine and one learner rank; on one GPU they share it (placement.mode=auto → colocated).
            "rollout": {"use_gpu": gpu, "enforce_eager": not gpu, **(GPU_TOKEN_BUDGETS if gpu else {})},
            "sync": {"transport": "object_store"},
        }
    if profile == "gpu":
        # How many engines and learner ranks: from the Ray cluster's GPUs when the run starts (placement.py), not
        # from this machine, which may be a CPU-only head node.
        return {
            "model": {"dtype": "bfloat16"},
            "rollout": {
                "num_workers": 0,
                "use_gpu": True,
                "enforce_eager": False,
                **GPU_TOKEN_BUDGETS,
            },
            "env": {"num_actors": 0},  # one env host per engine, packed beside it
            "learner": {
                "backend": "deepspeed",
                "zero_stage": 2,
                "use_gpu": True,
                "num_workers": 0,
                # Micro-batches sized by tokens: as much memory as 4 sequences of max_total_tokens at most (the fixed 4
                # of before), but short sequences share a micro-batch (fewer, larger kernels: docs/learner_speed.md).
                "micro_batch_size": 32,
                "micro_batch_tokens": 4 * GPU_TOKEN_BUDGETS["max_total_tokens"],
            },
            "sync": {"transport": "collective"},
        }
    raise ValueError(f"unknown profile {profile!r}")
