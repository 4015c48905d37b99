"""Run outputs: metrics.jsonl, wandb in offline mode (no network needed), the reward-curve PNG, resume truncation."""

import json

from agentrl_ray.config import RunConfig
from agentrl_ray.run.outputs import MetricsLog, plot_curves


def test_metrics_jsonl_wandb_offline_and_plot(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = RunConfig(name="w", wandb=True, wandb_mode="offline")
    log = MetricsLog(tmp_path, cfg, {"run": {"name": "w"}}, total_steps=3)
    log.log(0, {"eval/success": 0.2, "samples": 0})
    for step in (1, 2, 3):
        log.log(step, {"reward/mean": 0.1 * step, "samples": 8 * step})
    log.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    offline = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0  # synced later with `wandb sync`
    run_id = (tmp_path / "wandb_id").read_text()
    assert offline[0].name == f"run-{run_id}.wandb"
    # A resumed run (same run dir, started later) continues the same wandb run.
    resumed = MetricsLog(tmp_path, cfg, {"run": {"name": "w"}}, total_steps=3)
    assert resumed.wandb.id == run_id
    resumed.close()
    png = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curve.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # On resume from step 2, later records are dropped (they will be redone).
    log = MetricsLog(tmp_path, RunConfig(name="w"), {}, total_steps=3)
    log.truncate_after(2)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
