"""The README's Python API example (examples/python_api/train.py, a plain function as the tool, shipped to the Ray
workers by value) trains the default task to the same held-out success as `agentrl-ray train` with the CLI's
CalculatorEnv and the same seed: same prompts, same sampling seeds, same updates, so the same evaluations."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["run.steps=4", "run.eval_every=2", "data.eval_size=32", "run.checkpoint_every=0", "run.plot=false"]


def _evals(run_dir: Path) -> list[tuple]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/success"], r["eval/reward"]) for r in records if "eval/success" in r]


def _run(cmd: list[str], tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each run starts its own local Ray
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_readme_example_matches_the_cli(tmp_path):
    api_out = _run([sys.executable, str(ROOT / "examples/python_api/train.py"), *SMALL, "run.output_dir=api"], tmp_path)
    cli = [sys.executable, "-m", "agentrl_ray.cli", "train", str(ROOT / "examples/calculator/config.yaml")]
    _run([*cli, *SMALL, "run.output_dir=cli", "run.name=python_api"], tmp_path)

    api, cli_evals = _evals(tmp_path / "api" / "python_api"), _evals(tmp_path / "cli" / "python_api")
    print(f"\nheld-out (step, success, reward): API {api} | CLI {cli_evals}")
    assert [s for s, *_ in api] == [0, 2, 4]
    assert api == cli_evals
    assert "held-out success:" in api_out
    conversation = api_out.strip().splitlines()[-1]  # the generate(...) line: a list of OpenAI-style messages
    assert conversation.startswith("[{'role': 'assistant'")
