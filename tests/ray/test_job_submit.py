"""A `ray start --head` cluster on this machine: the training job submitted to it with `ray job submit` succeeds, and a
run started here without RAY_ADDRESS joins it (as plain `ray.init()` would); the stale record of a killed cluster is
ignored (a local Ray instead)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
AGENT_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "ray-client-server-port",
)


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
    # Its `ray` folder is the cluster's temp dir, where `ray start` records the cluster's address: with RAY_TMPDIR
    # set to its parent, a process here finds the record where it finds /tmp/ray's on a user's machine.
    tmp_root = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    temp_dir = os.path.join(tmp_root, "ray")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_TMPDIR": tmp_root}
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
            # Free ports for the per-node agents too: their defaults (52365, ...) clash with any other Ray on this
            # machine, and then the job server finds "no available agent".
            *(f"--{flag}={_port()}" for flag in AGENT_PORTS),
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
        _stop_cluster(temp_dir)
        shutil.rmtree(tmp_root, ignore_errors=True)


def _stop_cluster(temp_dir: str) -> None:
    """Stop this test's cluster only. `ray stop` kills every Ray process on the machine, other users' clusters
    included; this cluster's own processes name its temp dir on their command line (raylet, GCS, dashboard,
    monitors), and its workers are their children (they retitle themselves `ray::...`, so their command line does
    not say)."""
    import psutil

    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in proc.info["cmdline"] or []):
            roots.append(proc)
    procs = {p.pid: p for p in roots}
    for root in roots:
        try:
            procs.update({c.pid: c for c in root.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    for proc in procs.values():
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    # Some of them outlive SIGTERM for good (this wait took its whole 30 s before): a few seconds, then SIGKILL.
    _, alive = psutil.wait_procs(list(procs.values()), timeout=5)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=10)


@pytest.mark.integration
def test_ray_job_submit_runs_training(head_node, tmp_path):
    """As a user submits it: `--working-dir .` and a relative output dir. The job runs in a temporary copy in Ray's
    session folder; the outputs must land in a stable place instead ($AGENTRL_HOME here, the home folder by
    default), not in that copy."""
    address, env = head_node
    home = tmp_path / "home"
    cmd = [
        str(BIN / "ray"),
        "job",
        "submit",
        "--address",
        address,
        "--working-dir",
        ".",
        "--runtime-env-json",
        json.dumps({"env_vars": {"AGENTRL_HOME": str(home)}}),
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
        "run.output_dir=runs",
        "run.name=job",
    ]
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2]
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "succeeded" in (done.stdout + done.stderr)
    # The job's log is not a terminal: plain step lines with an ETA, no progress bar, no workers' output.
    assert "step    1/1 | reward " in done.stdout and "| eta " in done.stdout, done.stdout[-4000:]
    assert "RolloutWorker" not in done.stdout and "it/s]" not in done.stdout
    run_dir = home / "runs" / "job"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["eval/success"] <= 1.0
    assert summary["checkpoint"].startswith(str(run_dir))
    assert (run_dir / "metrics.jsonl").read_text().strip()
    assert "inside a Ray job's temporary working dir" in done.stdout + done.stderr  # the user is told where


JOIN = """
import sys
import ray
from agentrl_ray.infra.local_ray import init_ray
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.infra.threads import ThreadPolicy

cfg = load_config(sys.argv[1], ["profile=cpu"])
init_ray(cfg, ThreadPolicy.of(cfg))
print("gcs:", ray.get_runtime_context().gcs_address)
"""
CONFIG = str(Path(__file__).resolve().parents[2] / "examples/calculator/config.yaml")


@pytest.mark.long
def test_a_run_joins_the_ray_start_cluster_on_this_machine(head_node, tmp_path):
    """`ray start --head`, then a run without RAY_ADDRESS (a workstation): the run's driver joins that cluster. It
    used to pass a local Ray's settings to `ray.init()`, which refuses them when it finds a cluster."""
    _, env = head_node
    recorded = (Path(env["RAY_TMPDIR"]) / "ray" / "ray_current_cluster").read_text().strip()
    done = subprocess.run(
        [sys.executable, "-c", JOIN, CONFIG], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"gcs: {recorded}" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.integration
def test_a_stale_cluster_record_is_ignored(tmp_path):
    """The record a killed cluster left behind (no GCS serves its address): the run starts its own local Ray and
    says so, instead of failing to join a dead cluster."""
    tmp_root = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        stale = f"127.0.0.1:{_port()}"
        os.makedirs(os.path.join(tmp_root, "ray"))
        Path(tmp_root, "ray", "ray_current_cluster").write_text(stale)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_TMPDIR"] = tmp_root
        done = subprocess.run(
            [sys.executable, "-c", JOIN, CONFIG], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert f"ignoring Ray's record of a cluster at {stale}" in done.stderr
        gcs = done.stdout.split("gcs:")[1].split()[0]
        assert gcs != stale and "Started a local Ray instance" in done.stderr
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
