"""ECHO: GRPO against GRPO + ECHO on a task's config (held-out success against samples, environment-token CE), and the
grid probe that says whether a model's first moves depend on the goal, the gate before RL (docs/echo.md).

    python benchmarks/run.py echo --config examples/grid/delayed.yaml --pick reach --schedule linear --seeds 0 1 2 3 4
    python benchmarks/run.py echo --mode grid_probe --observe delayed
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "echo",
    claim="GRPO + ECHO against GRPO: held-out success for the samples spent",
    doc="docs/echo.md",
    modes={
        "echo_experiment": Mode(
            "GRPO against GRPO + ECHO: held-out success vs samples, env-token CE",
            "--config examples/grid/delayed.yaml --pick reach --schedule linear --seeds 0 1 2 3 4",
        ),
        "grid_probe": Mode(
            "whether a grid model's first moves depend on the goal (the gate before RL)",
            "--observe delayed",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
