"""Where outputs go (never into a Ray job's temporary working dir) and Hub model ids resolved from an offline
Hugging Face cache."""

import shutil
from pathlib import Path

import pytest

from agentrl_ray.builtin.resolve import resolve_model
from agentrl_ray.config import ConfigError
from agentrl_ray.infra import hub
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.infra.storage import checkpoint_root, exists, in_job_working_dir, resolve_path

JOB_DIR = "/tmp/ray/session_2026-11-23_10-00-00_1_1/runtime_resources/working_dir_files/_ray_pkg_0123abcd"


def test_relative_paths_resolve_against_the_working_dir(tmp_path):
    assert resolve_path("runs", cwd=str(tmp_path)) == str(tmp_path / "runs")
    assert resolve_path("/abs/runs", cwd=str(tmp_path)) == "/abs/runs"
    assert resolve_path("s3://bucket/runs") == "s3://bucket/runs"
    assert resolve_path("") == ""


def test_inside_a_ray_job_relative_paths_leave_the_temporary_working_dir(tmp_path, monkeypatch):
    assert in_job_working_dir(JOB_DIR) and not in_job_working_dir(str(tmp_path))
    monkeypatch.setenv("AGENTRL_HOME", str(tmp_path))
    assert resolve_path("runs", cwd=JOB_DIR) == str(tmp_path / "runs")
    monkeypatch.delenv("AGENTRL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path("runs", cwd=JOB_DIR) == str(tmp_path / "home" / "runs")


def test_storage_path_defaults_to_the_output_dir_and_output_dir_must_be_local(tmp_path):
    cfg = load_config(None, ["profile=cpu", f"run.output_dir={tmp_path}"])
    assert checkpoint_root(cfg.run.output_dir, cfg.run.storage_path) == str(tmp_path)
    cfg = load_config(None, ["profile=cpu", "run.storage_path=s3://bucket/runs"])
    assert checkpoint_root(cfg.run.output_dir, cfg.run.storage_path) == "s3://bucket/runs"
    with pytest.raises(ConfigError, match="run.output_dir 's3://b' must be a local folder"):
        load_config(None, ["profile=cpu", "run.output_dir=s3://b"])
    (tmp_path / "r").mkdir()
    assert exists(str(tmp_path), "r") and not exists(str(tmp_path), "nope")


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch, builtin_model_path):
    """A Hugging Face cache holding `agentrl/tiny-calculator` at one commit (the built-in model's files), offline."""
    repo = tmp_path / "hub" / "models--agentrl--tiny-calculator"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(builtin_model_path, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_hub_id_resolves_offline_to_one_commit(offline_cache):
    assert hub.is_hub_id("agentrl/tiny-calculator") and not hub.is_hub_id("builtin:tiny")
    snap = hub.resolve("agentrl/tiny-calculator")
    assert snap.commit == COMMIT and Path(snap.path) == offline_cache
    assert hub.resolve(f"agentrl/tiny-calculator@{COMMIT}").path == snap.path
    assert resolve_model("agentrl/tiny-calculator") == snap.path  # what every actor receives
    cfg = load_config(None, ["profile=cpu", "model.path=agentrl/tiny-calculator"])
    assert cfg.model.path == "agentrl/tiny-calculator"


def test_uncached_hub_id_offline_is_a_clear_error(offline_cache):
    with pytest.raises(ConfigError, match="not in .*hub and HF_HUB_OFFLINE=1 forbids downloading"):
        hub.resolve("Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ConfigError, match="a Hub id such as"):
        resolve_model("./no/such/folder")
