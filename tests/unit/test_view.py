"""The viewer's JSON API over run folders written by the run's own writers (view_runs.py), and the default rollout
sample: what a page sees of a finished run, a training one, a resumed one, and with a token."""

import json
import os
import time

from fastapi.testclient import TestClient
from view_runs import KNOWN_ANSWER, write_run

from agentrl_ray.view.server import make_app


def test_runs_metrics_rollouts_evals(tmp_path):
    write_run(tmp_path, "finished", 4, done=True)
    live = write_run(tmp_path, "live", 2, done=False)
    api = TestClient(make_app([tmp_path]))
    runs = {r["name"]: r for r in api.get("/api/runs").json()}
    assert runs["finished"]["status"] == "done" and runs["finished"]["step"] == 4
    assert runs["live"]["status"] == "training" and runs["live"]["steps"] == 12
    assert runs["finished"]["config"]["run"]["eval_every"] == 2

    got = api.get("/api/metrics", params={"run": "live"}).json()
    assert [r["step"] for r in got["records"]] == [1, 2] and got["next"] == 2
    live.advance()  # a new step: only it comes back to a page that has seen two
    got = api.get("/api/metrics", params={"run": "live", "since": 2}).json()
    assert [r["step"] for r in got["records"]] == [3] and "health/level" in got["records"][0]

    ro = api.get("/api/rollouts", params={"run": "finished"}).json()
    assert ro["steps"] == [1, 2, 3, 4] and ro["step"] == 4 and len(ro["records"]) == 4
    assert KNOWN_ANSWER in json.dumps(ro["records"])
    errors = api.get("/api/rollouts", params={"run": "finished", "step": 2, "errors": True}).json()["records"]
    assert [r["sample_index"] for r in errors] == [3]  # the one whose tool call failed
    rewarded = api.get("/api/rollouts", params={"run": "finished", "step": 2, "min_reward": 0.5}).json()["records"]
    assert [r["sample_index"] for r in rewarded] == [0, 1]

    (report,) = api.get("/api/evals", params={"run": "finished"}).json()
    assert report["name"] == "eval_000004" and report["step"] == 4 and "pass@1_ci95" in report
    tr = api.get("/api/transcripts", params={"run": "finished", "name": "eval_000004"}).json()["records"]
    assert len(tr) == 4 and KNOWN_ANSWER in json.dumps(tr)
    assert api.get("/api/transcripts", params={"run": "finished", "name": "../x"}).json()["records"] == []
    assert api.get("/api/metrics", params={"run": "nope"}).status_code == 404
    page = api.get("/")
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    assert api.get("/static/uPlot.iife.min.js").text.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32)")


def test_a_resumed_run_rereads_its_cut_metrics_and_a_silent_one_is_stopped(tmp_path):
    live = write_run(tmp_path, "live", 3, done=False)
    api = TestClient(make_app([tmp_path / "live"]))  # a run folder itself, not a folder of runs
    assert len(api.get("/api/metrics", params={"run": "live"}).json()["records"]) == 3
    live.log.truncate_after(1)  # resumed from step 1's checkpoint
    assert [r["step"] for r in api.get("/api/metrics", params={"run": "live"}).json()["records"]] == [1]
    old = time.time() - 3600
    for p in (live.dir / "metrics.jsonl", live.dir / "config.json", live.dir / "rollouts"):
        os.utime(p, (old, old))
    assert api.get("/api/runs").json()[0]["status"] == "stopped"


def test_another_address_needs_the_token(tmp_path):
    write_run(tmp_path, "finished", 1, done=True)
    api = TestClient(make_app([tmp_path], token="s3cret"))
    assert api.get("/api/runs").status_code == 403
    assert api.get("/", params={"token": "wrong"}).status_code == 403
    assert api.get("/", params={"token": "s3cret"}).status_code == 200
    assert api.get("/api/runs").status_code == 200  # the cookie set by the first page


def test_the_rollout_sample_goes_to_wandb_as_a_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    from view_runs import FakeRun

    run = FakeRun(tmp_path, "w", 2)
    run.cfg.run.wandb = True
    from agentrl_ray.run.outputs import MetricsLog

    run.log = MetricsLog(run.dir, run.cfg.run, run.cfg.to_dict(), 2)
    run.advance()
    run.advance()
    assert len(run.log.rollout_table.data) == 8 and KNOWN_ANSWER in run.log.rollout_table.data[0][-1]
    run.log.close()


def test_every_step_keeps_its_first_group_and_save_rollouts_steps_keep_all(tmp_path):
    from view_runs import group

    from agentrl_ray.config import Config
    from agentrl_ray.learner.watch import RunWatch

    class Log:  # outputs.LogClient's rollouts(), recorded
        def __init__(self):
            self.calls = []

        def rollouts(self, step, records, sample):
            self.calls.append((step, len(records), sample))

    cfg = Config()
    cfg.run.output_dir, cfg.run.save_rollouts, cfg.run.save_rollouts_groups = str(tmp_path), 2, 0
    rows = [{"id": "p1", "prompt": "What is 12 * 34?", "answer": "408"}]
    log = Log()
    watch = RunWatch(cfg, rows, log)
    for step in (1, 2):
        watch.after_step(step, [group(step), group(step)], {"reward/mean": 0.5})
    assert log.calls == [(1, 4, 4), (2, 8, 4)]  # step 2 (save_rollouts=2): both groups; the sample: the first
    # An environment of plain function tools only (the Python API's): the records carry their schemas.
    cfg.env.name, cfg.env.tools = "", ["agentrl_ray.envs.builtin.calculator:evaluate"]
    RunWatch(cfg, rows, log).after_step(3, [group(3)], {"reward/mean": 0.5})
    assert log.calls[-1] == (3, 4, 4)
    cfg.run.save_rollouts, cfg.run.rollout_sample_groups = 0, 0
    watch.after_step(4, [group(4)], {"reward/mean": 0.5})
    assert len(log.calls) == 3  # no sample asked for: nothing written
