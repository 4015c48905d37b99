"""What the always-on integrity checks cost a step (learner/integrity.py; target <= 2%, docs/integrity.md).

    python benchmarks/run.py overhead                                  # the default run, 30 steps, 2 pairs
    python benchmarks/run.py overhead --config examples/bfcl/config.yaml --steps 6 --pairs 1 -- model=...

Runs the installed CLI (`agentrl-ray train CONFIG`) with run.integrity=true and =false, alternating (true first,
`--pairs` times), with no evaluation and no checkpoint between the first and the last step. Two measures per run:
- the checks' own time, `time/integrity_s` (the probe's two forwards and the comparisons), against `time/step_s`;
- the A/B: the median step time with the checks against without (the first step, start-up's, left out).
On 2 cores the A/B's noise is a few percent: the first measure is the cost, the second says it is not hidden.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from suite.common.cli_runs import train_records, write_result


def run(config: str, steps: int, integrity: bool, extra: list[str]) -> list[dict]:
    overrides = [
        f"run.steps={steps}",
        "run.eval_at_start=false",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        f"run.integrity={str(integrity).lower()}",
        *extra,
    ]
    return [r for r in train_records(config, overrides) if r.get("step", 0) >= 2]


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="examples/calculator/config.yaml")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("extra", nargs="*", help="config overrides for both runs")
    a = p.parse_args(argv)
    on, off = [], []
    t0 = time.time()
    for _ in range(a.pairs):
        on += run(a.config, a.steps, True, a.extra)
        off += run(a.config, a.steps, False, a.extra)
    step_on = statistics.median(r["time/step_s"] for r in on)
    step_off = statistics.median(r["time/step_s"] for r in off)
    own = statistics.median(r["time/integrity_s"] / r["time/step_s"] for r in on)
    result = {
        "steps_per_run": a.steps,
        "pairs": a.pairs,
        "median_step_s_checks_on": step_on,
        "median_step_s_checks_off": step_off,
        "ab_overhead": step_on / step_off - 1,
        "median_integrity_s": statistics.median(r["time/integrity_s"] for r in on),
        "median_integrity_share_of_step": own,
        "probe_gap_max": max(r.get("integrity/weights/mean_gap", 0.0) for r in on),
        "behaviour_gap_max": max(r.get("integrity/behaviour_logprobs/mean_gap", 0.0) for r in on),
        "failures": sum(r.get("integrity/failures", 0) for r in on),
        "wall_s": time.time() - t0,
    }
    print(json.dumps(result, indent=1))
    summary = (
        f"the checks' own time {100 * own:.2f}% of a step; A/B step {step_on:.3f} s with them against "
        f"{step_off:.3f} s without ({100 * result['ab_overhead']:+.1f}%)"
    )
    write_result("integrity_cost", a.config, a.out, result, summary)
