"""`agentrl-ray doctor`: what hardware this machine has, and what each profile would run on it.

agentrl-ray doctor
"""

from __future__ import annotations

from agentrl_ray.config import Config, ConfigError
from agentrl_ray.infra.hardware import Hardware, detect_hardware
from agentrl_ray.infra.profiles import load_config, resolve_profile
from agentrl_ray.infra.sizing import cpus_requested
from agentrl_ray.infra.threads import ThreadPolicy


def hardware_lines(hw: Hardware) -> list[str]:
    c = hw.cpu
    lines = [
        f"CPU      {c.model if c.model.startswith(c.vendor) else f'{c.vendor} {c.model}'}",
        f"         {c.physical_cores} physical cores, {c.threads} hardware threads; {hw.cpus} usable by this process",
        f"         ISA: {c.isa}; native bf16: {'yes' if c.bf16 else 'no'}",
        f"RAM      {hw.ram_gib:.1f} GiB",
    ]
    lines += [f"GPU {i}    {g.vendor} {g.name}, {g.memory_gib:g} GiB" for i, g in enumerate(hw.gpu_devices)]
    if not hw.gpu_devices:
        found = f"{hw.gpus} from CUDA_VISIBLE_DEVICES" if hw.gpus else "none"
        lines.append(f"GPU      {found} (nvidia-smi, rocm-smi and amd-smi list no device)")
    lines.append(
        f"class    {'Ryzen-class workstation' if hw.workstation else 'GPU node' if hw.gpus else 'small CPU machine'}"
    )
    return lines


def plan_line(name: str, cfg: Config, hw: Hardware) -> str:
    r, lr = cfg.rollout, cfg.learner
    policy = ThreadPolicy.of(cfg)
    engine_threads = policy.engine_threads(cores=hw.cpus)
    learner_threads = policy.learner_worker_threads(cores=hw.cpus)
    device = "GPU" if lr.use_gpu else "CPU"
    dtype = "bf16 autocast" if lr.bf16 else cfg.model.dtype
    return (
        f"{name:<12} {r.num_workers} engine(s) x {engine_threads} threads"
        f"{f' + {r.num_gpus_per_worker:g} GPU' if r.num_gpus_per_worker else ''} | "
        f"learner {lr.num_workers} x {lr.backend} on {device} ({learner_threads} threads, {dtype}, "
        f"micro-batch {lr.micro_batch_size}{', LoRA' if lr.lora.enabled else ''}) | sync {cfg.sync.transport} | "
        f"Ray CPUs {cpus_requested(cfg):g} of {hw.cpus}"
    )


def main(path: str | None = None, overrides: list[str] | None = None) -> int:
    hw = detect_hardware()
    print("\n".join(hardware_lines(hw)))
    print(f"\nprofile=auto resolves to {resolve_profile('auto', hw)!r}. What each profile would run here:")
    for name in ("auto", "cpu", "lora", "gpu"):
        try:
            cfg = load_config(path, [*(overrides or []), f"profile={name}"])
        except ConfigError as exc:
            print(f"{name:<12} cannot run: {exc}")
            continue
        label = f"auto ({cfg.profile})" if name == "auto" else name
        print(plan_line(label, cfg, hw))
    if hw.gpus == 0:
        print("gpu needs a CUDA or ROCm GPU; shown for reference.")
    return 0
