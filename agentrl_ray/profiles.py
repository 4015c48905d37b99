"""Hardware profiles: presets that sit under the user's YAML and overrides.

`profile=auto` looks at the machine (cores, RAM, GPUs) and picks `gpu` when CUDA devices are visible, else `cpu`.
A Ryzen-class workstation (>= 8 cores, >= 32 GiB, no GPU) gets a larger CPU preset: more rollout workers and
learner threads. Explicit profiles:

- cpu:  vLLM CPU rollouts, full fine-tune on CPU (plain DDP over gloo), object-store weight sync;
- lora: LoRA adapters (peft) on CPU or one consumer GPU, adapter-only weight sync;
- gpu:  vLLM CUDA rollouts, DeepSpeed ZeRO-2 learner on the GPUs, collective (NCCL) weight sync.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hardware:
    cpus: int
    ram_gib: float
    gpus: int

    @property
    def workstation(self) -> bool:
        return self.gpus == 0 and self.cpus >= 8 and self.ram_gib >= 32


def node_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


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
            "rollout": {"num_gpus_per_worker": 0.4 if gpu else 0.0, "enforce_eager": not gpu},
            "sync": {"transport": "object_store"},
        }
    if profile == "gpu":
        gpus = max(hardware.gpus, 1)
        # Half the GPUs roll out, half learn; one GPU is shared (vLLM takes a fraction of its memory).
        learners = max(1, gpus // 2)
        rollouts = max(1, gpus - learners) if gpus > 1 else 1
        return {
            "model": {"dtype": "bfloat16"},
            "rollout": {
                "num_workers": rollouts,
                "num_gpus_per_worker": 1.0 if gpus > 1 else 0.4,
                "gpu_memory_utilization": 0.85 if gpus > 1 else 0.35,
                "enforce_eager": False,
                "num_cpus_per_worker": 1.0,
            },
            "learner": {
                "backend": "deepspeed",
                "zero_stage": 2,
                "use_gpu": True,
                "num_workers": learners,
                "num_cpus_per_worker": 2.0,
            },
            "sync": {"transport": "collective"},
        }
    raise ValueError(f"unknown profile {profile!r}")


def default_threads(
    role: str, *, overlapped: bool, rollout_workers: int, learner_workers: int = 1, cores: int | None = None
) -> int:
    """Torch threads of a CPU learner (`role="learner"`) or rollout engine (`"rollout"`) whose config leaves them
    at 0, from the cores of the node it runs on.

    On-policy (`overlapped=False`, `sync.max_staleness=0`) rollout and learning alternate, so each takes every core
    (several engines, or several learner workers, share them). Overlapped (`sync.max_staleness=1`) they run at the
    same time: the learner keeps every core and the engines share half of them. The learner is the longer phase
    in every run measured (docs/benchmarks.md), and when the rollout finishes first the learner has the machine to
    itself; while both run, the cores are oversubscribed, which costs little only because the driver then makes
    OpenMP threads sleep instead of spin when they wait (`OMP_WAIT_POLICY=PASSIVE`, `overlap_env`).
    """
    cores = cores or node_cores()
    if role == "learner":
        return max(1, cores // max(1, learner_workers))
    engines = max(1, cores // 2) if overlapped else cores
    return max(1, engines // max(1, rollout_workers))


def overlap_env(overlapped: bool, use_gpu: bool) -> dict[str, str]:
    """Environment for every actor process: with overlapped CPU phases, OpenMP threads sleep while they wait.

    Measured on 2 cores, 25M model, learner on 2 threads and engine on 1 at the same time: 6.08 s per step with
    the default (spinning) wait, 5.07 s with PASSIVE. On-policy the phases never share cores and spinning is
    faster for a small model's many short ops (tiny model: 1.04 s vs 1.38 s per step), so it stays as it is.
    A value the user exported wins."""
    if not overlapped or use_gpu or "OMP_WAIT_POLICY" in os.environ:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE"}
