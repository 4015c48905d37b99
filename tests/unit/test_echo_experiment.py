"""benchmarks/echo_experiment.py's reading of runs (metrics.jsonl on disk), without training anything."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "echo_experiment.py"


@pytest.fixture(scope="module")
def echo_experiment():
    spec = importlib.util.spec_from_file_location("echo_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
