"""A real model end to end: SmolLM2-135M on BFCL or GSM with tools, data to evaluation through SFT and GRPO
(docs/real_model.md), and the built-in model's quality before training, as rollouts see it.

    python benchmarks/run.py real_model bfcl
    python benchmarks/run.py real_model gsm_tools
    python benchmarks/run.py real_model --mode builtin_model_quality --n 500
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "real_model",
    claim="a real pretrained model learns a real benchmark's task: held-out pass@1 before and after",
    doc="docs/real_model.md",
    modes={
        "real_model": Mode(
            "SmolLM2-135M on BFCL or GSM with tools end to end: data, eval, SFT, GRPO + ECHO, eval",
            "bfcl",
        ),
        "builtin_model_quality": Mode(
            "the built-in model before training, as rollouts see it: success, tool-call rate",
            "--n 500",
            doc="docs/benchmarks.md",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
