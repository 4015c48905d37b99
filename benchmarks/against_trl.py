"""Against TRL: our trainer and TRL's GRPOTrainer on identical work (samples/s, start-up, peak memory), each side
run and timed alone, and where a run's start-up goes (docs/benchmarks.md, "Current results").

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py against_trl --steps 3 --prompts 4 --group 4 --repeats 1 --no-write    # a smoke run
    python benchmarks/run.py against_trl --mode trl_grpo_run --task tool --steps 3 --prompts 4 --group 4 \
        --out /tmp/trl-run                                                                       # TRL's side alone
    python benchmarks/run.py against_trl --mode startup_cpu --help                                 # start-up's CPU
"""

import sys

from suite import Benchmark, Mode, dispatch

BENCHMARK = Benchmark(
    "against_trl",
    claim="our trainer against TRL's GRPOTrainer on identical work: samples/s (>= 4x), start-up, peak memory",
    doc="docs/benchmarks.md",
    modes={
        "trl_side_by_side": Mode(
            "TRL's GRPOTrainer and ours on identical work: samples/s, start-up, peak RSS/PSS",
            "--model qwen05b --lora 1 --bf16 1 --steps 3 --prompts 8 --group 8 --max-completion 256 --micro-batch 4 "
            "--staleness 0 --repeats 2 --tasks single --eval-prompts 0",
        ),
        "trl_grpo_run": Mode(
            "one TRL GRPOTrainer run, timed step by step (trl_side_by_side's TRL side)",
            "--task tool --steps 3 --prompts 4 --group 4 --out /tmp/trl-run",
        ),
        "startup_cpu": Mode(
            "where a run's start-up goes: each process's phases, and its CPU-seconds against the cores' bound",
            "--phases --run-dir runs/startup/s -- agentrl-ray train examples/calculator/config.yaml "
            "run.output_dir=runs/startup run.name=s run.steps=3 run.eval_every=0 run.eval_at_start=false",
        ),
    },
)

if __name__ == "__main__":
    sys.exit(dispatch(BENCHMARK, sys.argv[1:]))
