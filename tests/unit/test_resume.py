"""Crash consistency of a run directory (agentrl_ray/resume.py, outputs.atomic_write_*, driver.check_run_dir): a torn
snapshot, a torn metrics line, a truncated weights or trainer-state file give a fallback or a clear error, never a
traceback. No Ray: the checkpoint folders are written in the layout the learner writes (trainer_state.pt, model/)."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentrl_ray.config import ConfigError
from agentrl_ray.driver import check_run_dir
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.run import resume
from agentrl_ray.run.outputs import MetricsLog, atomic_write_text


def make_checkpoint(run_dir: Path, step: int) -> Path:
    folder = run_dir / f"checkpoint_{step:06d}"
    (folder / "model").mkdir(parents=True)
    save_file({"w": torch.full((64, 64), float(step))}, str(folder / "model" / "model.safetensors"))
    torch.save({"step": step, "samples": 16 * step, "rank": 0, "optimizer": {"state": {}, "param_groups": []}},
               folder / "trainer_state.pt")  # fmt: skip
    return folder


def make_run(tmp_path: Path, steps=(2, 4, 6)) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for step in steps:
        make_checkpoint(run_dir, step)
    snapshot = {
        "ray_version": "2.60.0",
        "latest_checkpoint_result": {"checkpoint_dir_name": f"checkpoint_{steps[-1]:06d}"},
    }
    (run_dir / resume.SNAPSHOT).write_text(json.dumps(snapshot))
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in range(1, 7))
    )
    return run_dir


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_sound_run_dir_resumes_through_ray_trains_snapshot(tmp_path):
    run_dir = make_run(tmp_path)
    assert resume.prepare(run_dir) is None
    assert (run_dir / resume.SNAPSHOT).exists()


def test_torn_snapshot_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path, caplog):
    run_dir = make_run(tmp_path)
    truncate(run_dir / resume.SNAPSHOT)
    with caplog.at_level(logging.WARNING, logger="agentrl_ray.run.resume"):
        assert resume.prepare(run_dir) == run_dir / "checkpoint_000006"
    assert not (run_dir / resume.SNAPSHOT).exists()  # moved aside, so Ray Train starts from the checkpoint given
    assert len(list(run_dir.glob(f"{resume.SNAPSHOT}.corrupt-*"))) == 1
    assert "is unreadable (JSONDecodeError" in caplog.text


@pytest.mark.parametrize("damage", ["weights", "trainer_state", "missing_state"])
def test_unusable_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    run_dir = make_run(tmp_path)
    latest = run_dir / "checkpoint_000006"
    if damage == "weights":
        truncate(latest / "model" / "model.safetensors")
    elif damage == "trainer_state":
        truncate(latest / "trainer_state.pt")
    else:
        (latest / "trainer_state.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="agentrl_ray.run.resume"):
        assert resume.prepare(run_dir) == run_dir / "checkpoint_000004"
    assert not latest.exists() and len(list(run_dir.glob("checkpoint_000006.corrupt-*"))) == 1
    assert "the latest checkpoint checkpoint_000006 is unusable" in caplog.text


def test_a_trainer_state_that_would_run_code_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path, 2)

    class Payload:  # unpickling this would call a function: weights_only loading refuses it
        def __reduce__(self):
            return (print, ("pwned",))

    with open(folder / "trainer_state.pt", "wb") as f:
        pickle.dump({"step": 2, "x": Payload()}, f, protocol=2)
    assert "does not load (UnpicklingError" in resume.verify_checkpoint(folder)


def test_no_usable_checkpoint_is_a_clear_error(tmp_path):
    run_dir = make_run(tmp_path, steps=(2, 4))
    truncate(run_dir / resume.SNAPSHOT)
    for step in (2, 4):
        truncate(run_dir / f"checkpoint_{step:06d}" / "model" / "model.safetensors", 0.1)
    with pytest.raises(
        ConfigError,
        match=r"no checkpoint in .* can be loaded \(checkpoint_000004: model/model.safetensors is unreadable",
    ):
        resume.prepare(run_dir)


def test_a_first_checkpoint_torn_before_any_was_committed_starts_from_step_0(tmp_path, caplog):
    """A driver killed while its first checkpoint was written (seen in tests/ray/test_chaos.py's real SIGKILL):
    the folder is torn and Ray Train never wrote its snapshot. Nothing was committed, so resuming starts from step 0,
    as the uninterrupted run did; with a snapshot, none verifying stays an error (above)."""
    run_dir = make_run(tmp_path, steps=(1,))
    (run_dir / resume.SNAPSHOT).unlink()
    truncate(run_dir / "checkpoint_000001" / resume.TRAINER_STATE)
    with caplog.at_level(logging.WARNING, logger="agentrl_ray.run.resume"):
        assert resume.prepare(run_dir) is None
    assert "no checkpoint of" in caplog.text and "starting from step 0" in caplog.text
    assert not (run_dir / "checkpoint_000001").exists()  # moved aside: the new run writes its own


def test_torn_last_metrics_line_is_cut_with_a_warning(tmp_path, caplog):
    run_dir = make_run(tmp_path)
    path = run_dir / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 7, "reward/me')  # the process died mid-write
    with caplog.at_level(logging.WARNING, logger="agentrl_ray.run.resume"):
        resume.repair_metrics(run_dir / "metrics.jsonl")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    assert "ends with a torn line" in caplog.text
    # Then the learner drops the steps after the checkpoint it resumes from, and appends again.
    log = MetricsLog(run_dir, load_config().run, {}, 10)
    log.truncate_after(4)
    log.log(5, {"reward/mean": 1.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_torn_line_with_its_newline_and_corrupt_middle_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x\n')
    resume.repair_metrics(path)
    assert path.read_text() == '{"step": 1}\n'
    path.write_text('{"step": 1}\nGARBAGE\n{"step": 3}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2 is not valid JSON, and it is not the last line"):
        resume.repair_metrics(path)


def test_check_run_dir_hands_back_the_fallback(tmp_path):
    cfg = load_config(overrides=[f"run.output_dir={tmp_path}", "run.name=run", "run.resume=true"])
    run_dir = make_run(tmp_path)
    assert cfg.run_dir == run_dir
    assert check_run_dir(cfg) is None
    truncate(run_dir / resume.SNAPSHOT)
    assert check_run_dir(cfg) == run_dir / "checkpoint_000006"
    # With the snapshot gone, the checkpoint folders still mark the run as existing: never silently overwritten.
    fresh = load_config(overrides=[f"run.output_dir={tmp_path}", "run.name=run"])
    with pytest.raises(ConfigError, match="run.resume=true to continue it"):
        check_run_dir(fresh)


def test_atomic_write_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic_write_text(path, "old")

    def fail(fd):  # the disk fails after the new bytes were written to the temporary file
        raise OSError("I/O error")

    monkeypatch.setattr("agentrl_ray.run.outputs.os.fsync", fail)
    with pytest.raises(OSError, match="I/O error"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    monkeypatch.undo()
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
