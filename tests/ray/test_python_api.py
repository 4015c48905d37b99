"""The README's Python API example (examples/python_api/train.py, a plain function as the tool, shipped to the Ray
workers by value) trains the default task to the same held-out success as `agentrl-ray train` with the CLI's
CalculatorEnv and the same seed: same prompts, same sampling seeds, same updates, so the same evaluations."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["run.steps=4", "run.eval_every=2", "data.eval_size=32", "run.checkpoint_every=0", "run.plot=false"]


def _evals(run_dir: Path) -> list[tuple]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/success"], r["eval/reward"]) for r in records if "eval/success" in r]


def _run(cmd: list[str], tmp_path: Path, returncode: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each run starts its own local Ray
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == returncode, done.stderr[-4000:]
    return done


CLI = [sys.executable, "-m", "agentrl_ray.cli", "train", str(ROOT / "examples/calculator/config.yaml")]
# Lines of others that once buried the step lines on the console: Ray's driver and core worker, Ray Train's
# controller, vLLM CPU, DeepSpeed, transformers' loading bars.
NOISE = (
    "Started a local Ray instance",
    "constructor arguments in the object store",
    "TrainController",
    "RayTrainWorker",
    "RolloutWorker",
    "libtcmalloc",
    "set_num_threads",
    "Triton",
    "NUMA",
    "Setting accelerator",
    "Loading weights",
    "WARNING",
)


@pytest.mark.long
def test_readme_example_matches_the_cli(tmp_path):
    api_out = _run([sys.executable, str(ROOT / "examples/python_api/train.py"), *SMALL, "run.output_dir=api"], tmp_path)
    api_out = api_out.stdout
    cli_run = _run([*CLI, *SMALL, "run.output_dir=cli", "run.name=python_api"], tmp_path)
    # The console is the user's (infra/console.py): the first line names the log file, then one line per step and
    # evaluation; what Ray, vLLM, DeepSpeed and Ray Train print is in the file.
    console = cli_run.stdout + cli_run.stderr
    log = tmp_path / "cli" / "python_api" / "log.txt"
    assert cli_run.stdout.splitlines()[0].endswith(f"goes to {log} (--verbose shows it here)"), console
    for step in range(1, 5):
        assert f"step {step:>4}/4 | reward " in console, console
    assert "step    0/4 | eval success" in console and "| eval success" in cli_run.stdout.splitlines()[-2]
    assert cli_run.stdout.splitlines()[-1].startswith("done: ")
    for noise in NOISE:
        assert noise not in console, (noise, console)
    ours = [line for line in console.splitlines() if not line.startswith(("step ", "done: ", "agentrl-ray: "))]
    assert ours == [], console
    # A local run starts Ray without its dashboard (agentrl_ray/local_ray.py), and Ray Train's helpers that poll the
    # dashboard's state API (every second, for the whole run) stay quiet about its absence.
    logged = log.read_text()
    assert "Started a local Ray instance" in logged and "View the dashboard" not in logged
    assert "Failed to query Ray Train Controller" not in logged and "State API" not in logged
    assert "libtcmalloc is not found" in logged  # a vLLM CPU engine's warning, from its Ray worker: kept

    api, cli_evals = _evals(tmp_path / "api" / "python_api"), _evals(tmp_path / "cli" / "python_api")
    print(f"\nheld-out (step, success, reward): API {api} | CLI {cli_evals}")
    assert [s for s, *_ in api] == [0, 2, 4]
    assert api == cli_evals
    assert "held-out success:" in api_out
    conversation = api_out.strip().splitlines()[-1]  # the generate(...) line: a list of OpenAI-style messages
    assert conversation.startswith("[{'role': 'assistant'")


BAD_INPUT = """
import sys
import psutil
import ray
from agentrl_ray import driver
from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config

cfg = load_config(sys.argv[1], sys.argv[2:])
try:
    driver.train(cfg)
except ConfigError as exc:
    print("refused:", exc)
ray_children = [p.name() for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
print("ray initialized:", ray.is_initialized(), "| children:", sorted(ray_children))
"""


@pytest.mark.integration
def test_bad_input_found_while_ray_starts_ends_the_run_cleanly(tmp_path):
    """The preflight's tokenizer loads while Ray starts; a prompt over the token budget still fails before any actor
    starts, naming the key to change, and the Ray that train() started is shut down while the caller (a notebook,
    a script) goes on: nothing of it is left running."""
    config = str(ROOT / "examples/calculator/config.yaml")
    bad = ["rollout.max_total_tokens=50", "rollout.max_tokens_per_turn=8", "run.output_dir=out"]
    done = _run([sys.executable, "-c", BAD_INPUT, config, *bad], tmp_path)
    assert "Started a local Ray instance" in done.stderr  # Ray was up when the preflight failed
    assert "refused: data.train 'builtin:arithmetic' row 0" in done.stdout
    assert "rollout.max_total_tokens=50 leaves no room to generate" in done.stdout
    assert "ray initialized: False | children: []" in done.stdout, done.stdout
    assert not list(tmp_path.rglob("metrics.jsonl"))


LOCAL_RAY = """
import sys, time
import psutil
import ray
from agentrl_ray.infra.local_ray import init_ray
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.infra.threads import ThreadPolicy

cfg = load_config(sys.argv[1], [])
init_ray(cfg, ThreadPolicy.of(cfg))
time.sleep(4)  # the raylet starts prestarted workers as the first driver connects
names = sorted(p.name() for p in psutil.Process().children(recursive=True))
print("children:", names)
print("watcher:", ray.get_runtime_context().runtime_env["env_vars"]["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"])
"""


@pytest.mark.long
def test_a_local_ray_starts_no_process_the_run_cannot_use(tmp_path):
    """A local run's Ray: no idle workers started ahead of the actors (each actor takes a process of its own runtime
    environment), and Ray Train told not to start its preemption watcher (local_ray.py)."""
    done = _run([sys.executable, "-c", LOCAL_RAY, str(ROOT / "examples/calculator/config.yaml")], tmp_path)
    children = done.stdout.split("children:")[1].splitlines()[0]
    assert "raylet" in children and "gcs_server" in children
    assert "ray::IDLE" not in children
    assert "watcher: 0" in done.stdout
