"""What the machine has: CPU (vendor, model, ISA, physical cores vs threads), RAM, NVIDIA and AMD (ROCm) GPUs.

Read without initializing CUDA or ROCm in the driver: `/proc/cpuinfo`, the process's CPU affinity, and the vendors'
command-line tools when they are installed:

    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader      one line per GPU: "NAME, 24564 MiB"
    rocm-smi --showproductname --showmeminfo vram --json                {"card0": {"Card Series": ..,
                                                                          "VRAM Total Memory (B)": ..}, ..}
    amd-smi static --asic --vram --json                                  (newer ROCm, when rocm-smi is absent)

Every parser is a pure function of the tool's text (unit-tested on recorded outputs); a tool that is missing, fails
or times out means "none of those GPUs". `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES` limit the count as they
limit what the process may use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_ray.infra.threads import node_cores


@dataclass(frozen=True)
class CPUInfo:
    vendor: str = "unknown"  # "AMD", "Intel", "ARM" or "unknown"
    model: str = "unknown"
    physical_cores: int = 0  # of the whole machine (0: not reported)
    threads: int = 0
    flags: frozenset[str] = frozenset()

    @property
    def avx2(self) -> bool:
        return "avx2" in self.flags

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.flags

    @property
    def bf16(self) -> bool:
        """Native bfloat16 matrix math: AVX512_BF16 (Zen 4+, Cooper Lake+) or AMX-BF16 (Sapphire Rapids+)."""
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    @property
    def isa(self) -> str:
        names = [("AMX", self.amx), ("AVX512_BF16", self.bf16 and self.avx512), ("AVX-512", self.avx512)]
        names.append(("AVX2", self.avx2))
        return " ".join(n for n, ok in names if ok) or "baseline"


@dataclass(frozen=True)
class GPUInfo:
    vendor: str  # "nvidia" or "amd"
    name: str
    memory_gib: float


@dataclass(frozen=True)
class Hardware:
    cpus: int  # cores this process may run on (affinity), what Ray counts
    ram_gib: float
    gpus: int
    cpu: CPUInfo = CPUInfo()
    gpu_devices: tuple[GPUInfo, ...] = field(default_factory=tuple)

    @property
    def workstation(self) -> bool:
        """A Ryzen-class desktop without a GPU: enough cores and memory for two engines and a larger learner."""
        return self.gpus == 0 and self.cpus >= 8 and self.ram_gib >= 32

    @property
    def gpu_memory_gib(self) -> float:
        return min((g.memory_gib for g in self.gpu_devices), default=0.0)


# ---------------------------------------------------------------------------------------------------- parsers


def parse_cpuinfo(text: str) -> CPUInfo:
    """Vendor, model, ISA flags, physical cores and hardware threads from the text of /proc/cpuinfo."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    entries = []
    for block in blocks:
        entry = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                entry[key.strip().lower()] = value.strip()
        entries.append(entry)
    procs = [e for e in entries if "processor" in e and e["processor"].isdigit()]
    first = procs[0] if procs else (entries[0] if entries else {})
    vendor_id = first.get("vendor_id", "")
    vendor = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(vendor_id, "unknown")
    if vendor == "unknown" and ("cpu implementer" in first or "CPU implementer" in text):
        vendor = "ARM"
    model = first.get("model name") or first.get("cpu model") or "unknown"
    flags = frozenset((first.get("flags") or first.get("features") or "").split())
    cores = {(e.get("physical id", "0"), e["core id"]) for e in procs if "core id" in e}
    physical = len(cores) or len(procs)
    return CPUInfo(vendor=vendor, model=model, physical_cores=physical, threads=len(procs), flags=flags)


def parse_nvidia_smi(text: str) -> list[GPUInfo]:
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader` -> one GPUInfo per line."""
    gpus = []
    for line in text.strip().splitlines():
        name, sep, memory = line.rpartition(",")
        if not sep:
            continue
        gpus.append(GPUInfo("nvidia", name.strip(), _mib_to_gib(memory)))
    return gpus


def _mib_to_gib(text: str) -> float:
    number = text.strip().split()[0] if text.strip() else "0"
    try:
        return round(float(number) / 1024, 1)
    except ValueError:
        return 0.0


def parse_rocm_smi(text: str) -> list[GPUInfo]:
    """`rocm-smi --showproductname --showmeminfo vram --json` -> one GPUInfo per card (system entries skipped)."""
    data = json.loads(text)
    gpus = []
    for key in sorted(data, key=lambda k: (len(k), k)):
        card = data[key]
        if not key.lower().startswith("card") or not isinstance(card, dict):
            continue
        name = next(
            (card[k] for k in ("Card Series", "Card series", "Device Name", "Card SKU", "Card model") if card.get(k)),
            key,
        )
        vram = card.get("VRAM Total Memory (B)", 0)
        gpus.append(GPUInfo("amd", str(name).strip(), round(int(vram) / 2**30, 1)))
    return gpus


def parse_amd_smi(text: str) -> list[GPUInfo]:
    """`amd-smi static --asic --vram --json` -> one GPUInfo per GPU."""
    data = json.loads(text)
    entries = data if isinstance(data, list) else data.get("gpu_data", [])
    gpus = []
    for entry in entries:
        name = entry.get("asic", {}).get("market_name", "AMD GPU")
        size = entry.get("vram", {}).get("size", {})
        mib = size.get("value", 0) if isinstance(size, dict) else str(size).split()[0]
        gpus.append(GPUInfo("amd", str(name), round(float(mib) / 1024, 1)))
    return gpus


# ---------------------------------------------------------------------------------------------------- detection


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _visible(env_var: str, found: int) -> int:
    visible = os.environ.get(env_var)
    if visible is None:
        return found
    return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])


def detect_gpus() -> list[GPUInfo]:
    gpus: list[GPUInfo] = []
    text = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    if text:
        gpus += parse_nvidia_smi(text)[: _visible("CUDA_VISIBLE_DEVICES", len(parse_nvidia_smi(text)))]
    amd: list[GPUInfo] = []
    text = _run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
    try:
        if text:
            amd = parse_rocm_smi(text)
        elif (text := _run(["amd-smi", "static", "--asic", "--vram", "--json"])) is not None:
            amd = parse_amd_smi(text)
    except (ValueError, KeyError, TypeError, AttributeError):
        amd = []  # a format this parser does not know: report no AMD GPU rather than a wrong one
    return gpus + amd[: _visible("HIP_VISIBLE_DEVICES", len(amd))]


def emulated_bf16_warning(cpu: CPUInfo, setting: str) -> str | None:
    """A warning for `setting` (bfloat16 math on this CPU) when the CPU has no native bfloat16: oneDNN then converts
    every operand to float32, and a bfloat16 matmul measured 5.2x slower than a float32 one (docs/benchmarks.md).
    None on a CPU with AVX512_BF16 or AMX, or one whose flags are unknown."""
    if cpu.bf16 or not cpu.flags:
        return None
    return (
        f"{setting} on a CPU without native bfloat16 (no AVX512_BF16 or AMX: {cpu.model}): bfloat16 matmuls are "
        "emulated, ~5x slower than float32 on such a CPU; float32 is faster here (docs/benchmarks.md)"
    )


def this_cpu() -> CPUInfo:
    """The CPU of the machine this process runs on (empty where /proc/cpuinfo does not exist)."""
    cpuinfo = Path("/proc/cpuinfo")
    return parse_cpuinfo(cpuinfo.read_text()) if cpuinfo.exists() else CPUInfo()


def detect_hardware() -> Hardware:
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        ram = 0.0
    cpu = this_cpu()
    devices = detect_gpus()
    gpus = len(devices)
    if not devices and os.environ.get("CUDA_VISIBLE_DEVICES"):
        # Logical GPUs given by a scheduler (a Ray node declaring num_gpus) without a vendor tool to list them.
        gpus = _visible("CUDA_VISIBLE_DEVICES", 0)
    return Hardware(cpus=node_cores(), ram_gib=ram, gpus=gpus, cpu=cpu, gpu_devices=tuple(devices))
