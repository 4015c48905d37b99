"""Environments: hundreds of environments on a few EnvHost actors (docs/sandbox.md), each env.isolation level's create
and call latency and memory (docs/reliability.md), and a sandboxed run's start cost and latency under load.

    python benchmarks/run.py environments --instances 32                       # a quick check
    python benchmarks/run.py environments --mode env_isolation thread process
    python benchmarks/run.py environments --mode env_isolation --adapters      # the adapters' per-step cost
    python benchmarks/run.py environments --mode sandbox_latency --concurrent 1024
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "environments",
    claim="hundreds of environments at once, isolated, at a latency a rollout does not wait on",
    doc="docs/sandbox.md",
    modes={
        "env_scale": Mode(
            "hundreds of environments on a few EnvHost actors, one tool call each: latency",
            "--instances 32",
        ),
        "env_isolation": Mode(
            "create and tool-call latency and memory of each env.isolation level, 1 and 512 at once",
            "thread process",
            doc="docs/reliability.md",
        ),
        "sandbox_latency": Mode(
            "a sandboxed run's start cost, and latency with hundreds at once",
            "--concurrent 1024",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
