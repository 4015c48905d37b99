"""The echo benchmark's echo_experiment mode: its reading of runs (metrics.jsonl on disk), without training anything."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def echo_experiment():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from suite.echo import echo_experiment

        yield echo_experiment
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def write_run(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_peak_entropy_is_the_largest_training_entropy_and_evaluations_do_not_count(echo_experiment, tmp_path):
    run = write_run(
        tmp_path / "lam0.05-seed0",
        [
            {"step": 0, "samples": 0, "eval/success": 0.2},
            {"step": 1, "samples": 128, "loss/entropy": 0.07},
            {"step": 2, "samples": 256, "loss/entropy": 1.15},
            {"step": 3, "samples": 384, "loss/entropy": 0.3, "eval/success": 0.1},
        ],
    )
    assert echo_experiment.peak_entropy(run) == pytest.approx(1.15)
    assert math.isnan(echo_experiment.peak_entropy(write_run(tmp_path / "evals-only", [{"step": 0, "samples": 0}])))


def test_a_run_that_never_reaches_the_target_counts_one_interval_past_its_end(echo_experiment, tmp_path):
    evals = [{"step": s, "samples": 640 * i, "eval/success": v} for i, (s, v) in enumerate([(0, 0.1), (5, 0.3)])]
    run = write_run(tmp_path / "lam0-seed0", evals)
    assert echo_experiment.reach_or_censored(run, 0.3) == (640.0, False)
    assert echo_experiment.reach_or_censored(run, 0.5) == (1280.0, True)


def test_the_reach_pick_prefers_the_fewest_samples_and_breaks_ties_by_the_mean(echo_experiment, tmp_path):
    """Round 5's pick (fixed before its runs): fewest samples to the target, then the higher mean held-out success;
    round 4's `auc` pick reads only the mean, so the two can disagree, as here."""

    def run(name, values):
        evals = [{"step": 5 * i, "samples": 640 * i, "eval/success": v} for i, v in enumerate(values)]
        return write_run(tmp_path / name, evals)

    early = run("lam0.2-seed0", [0.1, 0.5, 0.2, 0.2])  # reaches 0.5 at 640, mean after step 0: 0.3
    steady = run("lam0.05-seed0", [0.1, 0.45, 0.45, 0.5])  # reaches it at 1920, mean 0.467
    tie = run("lam0.005-seed0", [0.1, 0.5, 0.3, 0.3])  # 640 like `early`, mean 0.367
    candidates = {0.2: early, 0.05: steady, 0.005: tie}
    assert echo_experiment.pick(candidates, 0.5, "reach") == 0.005
    assert echo_experiment.pick(candidates, 0.5, "auc") == 0.05
    assert echo_experiment.arm_label(0.05, "linear", 40) == "ECHO λ=0.05→0 (linear, 40 steps)"
    exp = echo_experiment.Experiment(ROOT / "examples/grid/delayed.yaml", [], decay_steps=40)
    assert exp.task == "grid-delayed"
    assert exp.variant_overrides("linear") == ["echo.schedule=linear", "echo.final_coeff=0", "echo.decay_steps=40"]
    assert exp.run_dir(0.05, 3, "linear").name == "lam0.05-linear-seed3"
