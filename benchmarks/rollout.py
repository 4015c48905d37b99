"""Rollout: a training run's samples/s and per-phase split (`make bench`), the engine's prefill and decode timed
apart, the two rollout backends side by side, and where a step's time goes in each pipeline mode (docs/default_run.md,
docs/backends.md, docs/async.md).

    python benchmarks/run.py rollout                                   # the default run, 8 steps, then its split
    python benchmarks/run.py rollout --run-dir runs/calculator         # an existing run's metrics
    python benchmarks/run.py rollout --mode generation_phases --model qwen05b --prompts 8 --group 8 --decode 32
    python benchmarks/run.py rollout --mode backend_compare --model tiny --dtype float32
    python benchmarks/run.py rollout --mode pipeline_timeline --steps 12
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "rollout",
    claim="a training run's throughput and where its step goes: generation, environment, learner, sync",
    doc="docs/default_run.md",
    modes={
        "throughput": Mode(
            "a training run's samples/s, sampled tokens/s and per-phase split (make bench)",
            "--run-dir runs/calculator",
        ),
        "generation_phases": Mode(
            "the vLLM engine's prefill and decode timed apart, at a shape",
            "--model qwen05b --prompts 8 --group 8 --decode 32",
            doc="docs/benchmarks.md",
        ),
        "backend_compare": Mode(
            "the vLLM and torch rollout engines on the same prompts: tokens/s, log-prob gaps",
            "--model tiny --dtype float32",
            doc="docs/backends.md",
        ),
        "pipeline_timeline": Mode(
            "the long-tail agent workload per pipeline mode: engines generating/waiting/idle, learner busy/waiting",
            "--steps 12",
            doc="docs/async.md",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
