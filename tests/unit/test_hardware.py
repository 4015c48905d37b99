"""Hardware detection on recorded tool outputs (tests/unit/data/hardware: a Ryzen 9 7950X, an EPYC 7313P and a
two-socket Xeon Gold 6434 /proc/cpuinfo; nvidia-smi and rocm-smi outputs), and profiles that fit every node size."""

from pathlib import Path

import pytest

from agentrl_ray.config import Config, deep_merge
from agentrl_ray.config.checking import build as _build
from agentrl_ray.config.stability import STABILITY, stability_preset
from agentrl_ray.infra.hardware import (
    CPUInfo,
    GPUInfo,
    Hardware,
    emulated_bf16_warning,
    parse_cpuinfo,
    parse_nvidia_smi,
    parse_rocm_smi,
)
from agentrl_ray.infra.profiles import profile_preset, resolve_profile
from agentrl_ray.infra.sizing import cpus_requested

DATA = Path(__file__).parent / "data" / "hardware"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_ryzen_7950x():
    cpu = parse_cpuinfo(read("cpuinfo_ryzen_7950x.txt"))
    assert (cpu.vendor, cpu.model) == ("AMD", "AMD Ryzen 9 7950X 16-Core Processor")
    assert (cpu.physical_cores, cpu.threads) == (16, 32)
    assert cpu.avx2 and cpu.avx512 and cpu.bf16 and not cpu.amx  # Zen 4: AVX512_BF16, no AMX


def test_epyc_7313p_has_avx2_only():
    cpu = parse_cpuinfo(read("cpuinfo_epyc_7313p.txt"))
    assert cpu.vendor == "AMD" and "EPYC 7313P" in cpu.model
    assert (cpu.physical_cores, cpu.threads) == (16, 32)
    assert cpu.avx2 and not cpu.avx512 and not cpu.bf16
    assert cpu.isa == "AVX2"


def test_two_socket_xeon_counts_cores_per_socket():
    cpu = parse_cpuinfo(read("cpuinfo_xeon_6434_2s.txt"))
    assert cpu.vendor == "Intel" and cpu.model == "Intel(R) Xeon(R) Gold 6434"
    # Core ids repeat on each socket: 2 sockets x 8 cores, each with two threads.
    assert (cpu.physical_cores, cpu.threads) == (16, 32)
    assert cpu.amx and cpu.bf16 and cpu.avx512
    assert cpu.isa.startswith("AMX")


def test_gpu_tools():
    rtx = parse_nvidia_smi(read("nvidia_smi_rtx4090.csv"))
    assert rtx == [GPUInfo("nvidia", "NVIDIA GeForce RTX 4090", 24.0)]
    h100 = parse_nvidia_smi(read("nvidia_smi_4xh100.csv"))
    assert len(h100) == 4 and h100[0].memory_gib == pytest.approx(79.6, abs=0.1)
    radeon = parse_rocm_smi(read("rocm_smi_7900xtx.json"))
    assert radeon == [GPUInfo("amd", "Radeon RX 7900 XTX", 24.0)]  # the "system" entry is not a card
    mi300 = parse_rocm_smi(read("rocm_smi_2xmi300x.json"))
    assert [g.name for g in mi300] == ["AMD Instinct MI300X OAM"] * 2 and mi300[0].memory_gib == 192.0


def test_bf16_only_where_the_isa_has_it():
    zen4 = parse_cpuinfo(read("cpuinfo_ryzen_7950x.txt"))
    zen3 = parse_cpuinfo(read("cpuinfo_epyc_7313p.txt"))
    assert profile_preset("cpu", Hardware(16, 64, 0, cpu=zen4))["learner"]["bf16"] is True
    assert profile_preset("cpu", Hardware(16, 64, 0, cpu=zen3))["learner"]["bf16"] is False
    assert "bf16" not in profile_preset("cpu", Hardware(2, 16, 0, cpu=zen4))["learner"]  # not a workstation


def test_bf16_asked_for_on_a_cpu_that_emulates_it_is_warned_about():
    zen4 = parse_cpuinfo(read("cpuinfo_ryzen_7950x.txt"))
    zen3 = parse_cpuinfo(read("cpuinfo_epyc_7313p.txt"))
    xeon_amx = parse_cpuinfo(read("cpuinfo_xeon_6434_2s.txt"))
    warning = emulated_bf16_warning(zen3, "learner.bf16=true")
    assert warning.startswith("learner.bf16=true on a CPU without native bfloat16") and zen3.model in warning
    assert emulated_bf16_warning(zen4, "learner.bf16=true") is None
    assert emulated_bf16_warning(xeon_amx, "learner.bf16=true") is None
    assert emulated_bf16_warning(CPUInfo(), "learner.bf16=true") is None  # flags unknown: say nothing


def test_engines_scale_with_cores():
    assert profile_preset("cpu", Hardware(8, 32, 0))["rollout"]["num_workers"] == 2
    assert profile_preset("cpu", Hardware(64, 256, 0))["rollout"]["num_workers"] == 4


def test_amd_gpus_pick_the_gpu_profile():
    assert resolve_profile("auto", Hardware(16, 64, 1, gpu_devices=(GPUInfo("amd", "MI300X", 192.0),))) == "gpu"


@pytest.mark.parametrize("cores", [1, 2, 8, 64])
@pytest.mark.parametrize("profile", ["cpu", "lora", "gpu"])
@pytest.mark.parametrize("stability", STABILITY)
def test_every_profile_fits_the_cores(cores, profile, stability):
    """The Ray CPU requests of every profile fit the node (8 cores once asked for 8.25 and never started)."""
    for ram, gpus in ((8, 0), (64, 0), (64, 1), (512, 4)):
        hw = Hardware(cores, ram, gpus if profile == "gpu" else 0, cpu=CPUInfo(physical_cores=cores, threads=cores))
        preset = profile_preset(profile, hw)
        preset = deep_merge(preset, stability_preset(stability, preset))
        cfg = _build(Config, {**preset, "profile": profile})
        # The gpu profile leaves its counts at 0 (sized from the cluster's GPUs by the placement plan): one each.
        cfg.rollout.num_workers = max(1, cfg.rollout.num_workers)
        cfg.learner.num_workers = max(1, cfg.learner.num_workers)
        assert 0 < cpus_requested(cfg) <= cores, (profile, cores, ram, gpus, cpus_requested(cfg))
        assert cfg.rollout.num_cpus_per_worker > 0 and cfg.learner.num_cpus_per_worker > 0
