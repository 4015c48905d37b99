"""Weight sync: a push between two Ray nodes by the object store and by gloo, per payload size (docs/scaling.md), the
colocated handoff by CUDA IPC (docs/learner_speed.md), and LoRA's sync on vLLM CPU, merged or native.

    python benchmarks/run.py weight_sync --sizes-mb 8 64
    python benchmarks/run.py weight_sync --mode ipc_handoff --device cpu --shape tiny --repeats 2   # the logic, a CPU
    python benchmarks/run.py weight_sync --mode lora_sync --model qwen05b --dtype bfloat16 --modes merge
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "weight_sync",
    claim="what moving the learner's weights into the engines costs, per transport",
    doc="docs/scaling.md",
    modes={
        "sync_cost": Mode(
            "weight push between two Ray nodes, object store against gloo, per payload size",
            "--sizes-mb 8 64",
        ),
        "ipc_handoff": Mode(
            "colocated weight handoff by CUDA IPC against the object store, s/GB",
            "--shape 0.5b --shape 1.5b --repeats 5",
            doc="docs/learner_speed.md",
        ),
        "lora_sync": Mode(
            "LoRA weight sync on vLLM CPU, merged into the base against vLLM's own LoRA",
            "--model qwen05b --dtype bfloat16 --modes merge",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
