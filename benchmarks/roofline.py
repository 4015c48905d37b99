"""The roofline: how far a training step is from what this machine's CPU could do, from the step's FLOPs and bytes
against the GEMM rate and bandwidth measured here, and where the GEMM library falls short (docs/benchmarks.md).

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py roofline --model qwen05b --lora-r 16 --group 8 --samples 64 --tokens 16384 \
        --generate-s 69.4 --learner-s 140.0                        # the whole-step bound of a measured step
    python benchmarks/run.py roofline --mode machine_peak --threads 1,2      # this CPU's GEMM rates and bandwidth
    python benchmarks/run.py roofline --mode gemm_forms --rounds 5           # the learner's products, three ways
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "roofline",
    claim="a step's whole-step bound on this CPU, and the share of it a step reaches",
    doc="docs/benchmarks.md",
    modes={
        "roofline": Mode(
            "a step's FLOPs and bytes against this CPU's GEMM rate and bandwidth: how far a speed-up is",
            "--model qwen05b --lora-r 16 --group 8 --samples 64 --tokens 16384 --generate-s 69.4 --learner-s 140.0",
        ),
        "machine_peak": Mode(
            "GEMM GFLOP/s (float32, bfloat16) at the 0.5B shape's matmuls, and copy bandwidth",
            "--threads 1,2",
        ),
        "gemm_forms": Mode(
            "the learner's matrix products as is, transposed and in row blocks: where the GEMM library is short",
            "--rounds 5",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
