"""This machine's bounds at the threads we use: GEMM GFLOP/s (float32, bfloat16) at the 0.5B shape's matmuls, and
memory bandwidth. The per-phase rooflines of docs/benchmarks.md divide by these numbers.

    python benchmarks/run.py roofline --mode machine_peak --threads 1,2 \
        --out benchmarks/results/machine_peak/<date>-<machine>.json

Shapes (M x K x N, `torch.mm`, best of repeated calls over >= 0.5 s; see roofline.best_time):
- square 2048: the large-GEMM ceiling;
- learner: 2048 tokens x hidden 896 x intermediate 4864 (an MLP projection of a micro-batch);
- head chunk: 110 tokens x 896 x vocab 151936 (one chunk of `chunked_logprobs`);
- decode 64 / decode 8: 64 or 8 sequences decoding together x 896 x 4864 (weights streamed, little reuse).
Bandwidth: a 512 MiB float32 copy (bytes read + written per second).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from results_path import with_meta
from suite.roofline.roofline import copy_bandwidth, gemm_flops

SHAPES = {
    "square_2048": (2048, 2048, 2048),
    "learner_2048x896x4864": (2048, 896, 4864),
    "head_chunk_110x896x151936": (110, 896, 151936),
    "decode_64x896x4864": (64, 896, 4864),
    "decode_8x896x4864": (8, 896, 4864),
}


def cpuinfo_field(cpuinfo: str, name: str) -> str:
    """The first CPU's `name` in /proc/cpuinfo's text ("unknown" where it has none)."""
    for line in cpuinfo.splitlines():
        if line.split(":", 1)[0].strip() == name:
            return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    cpuinfo = Path("/proc/cpuinfo").read_text()
    out = {
        "cpu": cpuinfo_field(cpuinfo, "model name"),
        # A VM may name its CPU only "AMD EPYC": family and model tell its generation apart (25/17: Zen 4, whose
        # 512-bit bfloat16 dot products run on 256-bit units; 26: Zen 5, twice that rate per core and clock).
        "cpu_family": cpuinfo_field(cpuinfo, "cpu family"),
        "cpu_model": cpuinfo_field(cpuinfo, "model"),
        "cpu_stepping": cpuinfo_field(cpuinfo, "stepping"),
        "cores": os.cpu_count(),
        "amx": "amx_bf16" in cpuinfo,
        "avx512_bf16": "avx512_bf16" in cpuinfo,
        "torch": torch.__version__,
        "by_threads": {},
    }
    print(
        f"{out['cpu']} (family {out['cpu_family']}, model {out['cpu_model']}), {out['cores']} cores, "
        f"AMX {out['amx']}, AVX512_BF16 {out['avx512_bf16']}, torch {out['torch']}"
    )
    for t in (int(x) for x in a.threads.split(",")):
        torch.set_num_threads(t)
        row = {f"{name}_{dn}_gflops": gemm_flops(*shape, dt) / 1e9 for name, shape in SHAPES.items()
               for dn, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}  # fmt: skip
        row["copy_gb_per_s"] = copy_bandwidth() / 1e9
        out["by_threads"][t] = row
        for k, v in row.items():
            print(f"  {t} thread(s) {k:<40} {v:8.1f}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        most = max(out["by_threads"])
        top = out["by_threads"][most]
        summary = (
            f"{most} thread(s): bf16 GEMM {top['square_2048_bf16_gflops']:.0f} GFLOP/s at 2048-square, "
            f"{top['decode_64x896x4864_bf16_gflops']:.0f} at decode 64; copy {top['copy_gb_per_s']:.1f} GB/s"
        )
        a.out.write_text(json.dumps(with_meta(out, summary), indent=2))
