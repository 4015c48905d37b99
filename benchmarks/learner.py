"""The learner's step alone: tokens/s and MFU through its own code, each speed lever on and off, on CUDA at the real
shapes and on a CPU at a small one (docs/learner_speed.md); and the CPU optimizer and DeepSpeed options
(docs/deepspeed.md).

    python benchmarks/run.py learner --device cpu --shape tiny --steps 1 --warmup 1     # the logic, on a CPU
    python benchmarks/run.py learner --device cuda --shape 0.5b --out /tmp/lt.json      # one GPU
    python benchmarks/run.py learner --mode gpu_learner                                 # the GPU's open targets
    DRY=1 python benchmarks/run.py learner --mode gpu_learner                           # their logic, on a CPU
    python benchmarks/run.py learner --mode cpu_adamw --params 100e6 --threads 2
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "learner",
    claim="the learner's step: MFU targets on a GPU, and what each speed lever gives",
    doc="docs/learner_speed.md",
    modes={
        "learner_throughput": Mode(
            "the learner's step alone (tokens/s, MFU), each speed lever on and off, CUDA or CPU",
            "--device cpu --shape tiny --steps 1 --warmup 1",
        ),
        "gpu_learner": Mode(
            "the GPU learner's open targets (fused linears, compile buckets) in one budgeted command; DRY=1: on a CPU",
        ),
        "cpu_adamw": Mode(
            "one AdamW step on a CPU: torch's foreach and fused kernels, DeepSpeed's FusedAdam",
            "--params 100e6 --threads 2",
            doc="docs/deepspeed.md",
        ),
        "deepspeed_options": Mode(
            "ZeRO-3 with optimizer offload, parameter offload, gradient checkpointing, 2 steps each",
            doc="docs/deepspeed.md",
        ),
        "qwen05b_shape": Mode(
            "builds the 0.5B shape (Qwen2.5-0.5B's architecture, random weights) other modes take; measures nothing",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
