"""Overhead: what rides along every training run costs its step, the always-on integrity checks (target <= 2%,
docs/integrity.md) and the viewer watching the run (docs/viewer.md), each measured as whole runs with it and without.

    python benchmarks/run.py overhead --steps 30 --pairs 2
    python benchmarks/run.py overhead --mode view_cost --steps 30 --rounds 2
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "overhead",
    claim="the integrity checks and the viewer cost a run's step a few percent at most",
    doc="docs/integrity.md",
    modes={
        "integrity_cost": Mode(
            "the always-on integrity checks' time per step, and the step time with them against without",
            "--steps 30 --pairs 2",
        ),
        "view_cost": Mode(
            "what agentrl-ray view costs a training run's step time",
            "--steps 30 --rounds 2",
            doc="docs/viewer.md",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
