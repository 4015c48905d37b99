"""Hardware profiles: presets that sit under the user's YAML and overrides (the thread policy is in `threads`).

`profile=auto` looks at the machine (cores, RAM, GPUs) and picks `gpu` when CUDA devices are visible, else `cpu`.
A Ryzen-class workstation (>= 8 cores, >= 32 GiB, no GPU) gets a larger CPU preset: more rollout workers and
learner threads. Explicit profiles:

- cpu:  vLLM CPU rollouts, full fine-tune on CPU (plain DDP over gloo), object-store weight sync;
- lora: LoRA adapters (peft) on CPU or one consumer GPU, adapter-only weight sync;
- gpu:  vLLM CUDA rollouts, DeepSpeed ZeRO-2 learner on the GPUs, collective (NCCL) weight sync; engine and
        learner counts come from the Ray cluster at start (`placement.py`), token budgets sized for real models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agentrl_ray.threads import node_cores


@dataclass(frozen=True)
class Hardware:
    cpus: int
    ram_gib: float
    gpus: int

    @property
    def workstation(self) -> bool:
        return self.gpus == 0 and self.cpus >= 8 and self.ram_gib >= 32


# Real models with a real tool system prompt: the prompt alone (tool schemas + instructions) is often 300-1,000
# tokens, and a tool-using answer several hundred more per turn.
GPU_TOKEN_BUDGETS = {"max_tokens_per_turn": 1024, "max_total_tokens": 8192, "max_num_seqs": 256}


def detect_hardware() -> Hardware:
    cpus = node_cores()
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        ram = 0.0
    return Hardware(cpus=cpus, ram_gib=ram, gpus=_count_gpus())


def _count_gpus() -> int:
    # Read CUDA_VISIBLE_DEVICES / nvidia-smi rather than initializing CUDA in the driver process.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def resolve_profile(requested: str, hardware: Hardware | None = None) -> str:
    if requested != "auto":
        return requested
    hardware = hardware or detect_hardware()
    return "gpu" if hardware.gpus > 0 else "cpu"


def profile_preset(profile: str, hardware: Hardware | None = None) -> dict[str, Any]:
    """Nested config values for a resolved profile (never 'auto')."""
    hardware = hardware or detect_hardware()
    if profile == "cpu":
        preset: dict[str, Any] = {
            "model": {"dtype": "float32"},
            "learner": {"backend": "ddp", "use_gpu": False, "num_workers": 1},
            "sync": {"transport": "object_store"},
        }
        if hardware.workstation:
            # Ryzen-class workstation: two rollout engines and more learner threads.
            preset["rollout"] = {"num_workers": 2, "num_cpus_per_worker": 2.0}
            preset["learner"].update(num_cpus_per_worker=4.0, torch_threads=max(2, hardware.cpus // 3))
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
                "num_cpus_per_worker": 1.0,
                **GPU_TOKEN_BUDGETS,
            },
            "env": {"num_actors": 0},  # one env host per engine, packed beside it
            "learner": {
                "backend": "deepspeed",
                "zero_stage": 2,
                "use_gpu": True,
                "num_workers": 0,
                "num_cpus_per_worker": 2.0,
                "micro_batch_size": 4,
            },
            "sync": {"transport": "collective"},
        }
    raise ValueError(f"unknown profile {profile!r}")
