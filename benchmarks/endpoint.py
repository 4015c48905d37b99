"""The OpenAI-compatible endpoint: its latency per call and per token against calling the engine, and the calculator
trained as the built-in environment against the same task as an OpenAI-client program (docs/openai_agent.md).

    python benchmarks/run.py endpoint --backend torch
    python benchmarks/run.py endpoint --mode openai_agent_compare runs/cmp_builtin runs/cmp_agent
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "endpoint",
    claim="an agent program behind the OpenAI-compatible endpoint trains like the built-in env, at little overhead",
    doc="docs/openai_agent.md",
    modes={
        "openai_endpoint": Mode(
            "the OpenAI-compatible endpoint's latency, sequential and concurrent",
            "--backend torch",
        ),
        "openai_agent_compare": Mode(
            "the calculator trained as the built-in env and as an OpenAI-client program",
            "runs/cmp_builtin runs/cmp_agent",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
