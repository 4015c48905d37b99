"""The training job, submitted with `ray job submit` to a local `ray start --head` cluster, succeeds."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_node(tmp_path, builtin_model_path):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    gcs, dash = _port(), _port()
    # A short temp dir: Ray's socket paths under it must stay within AF_UNIX's 107 bytes (pytest's tmp_path does not).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    subprocess.run(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            f"--port={gcs}",
            "--num-cpus=4",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        check=True,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        yield f"http://127.0.0.1:{dash}", env
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_training(head_node, tmp_path):
    address, env = head_node
    out = tmp_path / "runs"
    cmd = [
        str(BIN / "ray"),
        "job",
        "submit",
        "--address",
        address,
        "--",
        str(BIN / "agentrl-ray"),
        "train",
        "examples/calculator/config.yaml",
        "profile=cpu",
        "run.steps=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "data.eval_size=4",
        "run.eval_samples=1",
        "run.eval_at_start=false",
        f"run.output_dir={out}",
        "run.name=job",
    ]
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2]
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "succeeded" in (done.stdout + done.stderr)
    summary = json.loads((out / "job" / "summary.json").read_text())
    assert 0.0 <= summary["eval/success"] <= 1.0
