"""`agentrl-ray plan --measured RUN_DIR`: the expected balance of engines and learner from a measured run's per-phase
costs (agentrl_ray/infra/balance.py), its numbers computed by hand here."""

from __future__ import annotations

import json
import re

import pytest
from test_cli_commands import CONFIG, cli, one_line_error

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.balance import expected_balance, measured_costs
from agentrl_ray.infra.profiles import load_config


def _run(tmp_path, pipeline="batch", steps=4):
    """A finished run's folder: the calculator config at 4 prompts x 8 samples (32 a step), 2 engines, 1 learner
    rank; every step after the first: the slowest engine's call 1.6 s (0.4 s of it generating), update 0.8 s."""
    cfg = load_config(CONFIG, ["rollout.prompts_per_step=4", "rollout.group_size=8", f"sync.pipeline={pipeline}"])
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    slot = {"index": 0, "node": "n", "resources": {"CPU": 1}}
    (tmp_path / "placement.json").write_text(json.dumps({"engines": [slot, slot], "learners": [slot]}))
    first = {"step": 1, "time/step_s": 30.0, "time/rollout_worker_s": 20.0, "time/generate_s": 9.0,
             "time/learner_s": 9.0, "time/sync_s": 1.0}  # fmt: skip
    rest = [
        {"step": s, "time/step_s": 2.5, "time/rollout_worker_s": 1.6, "time/generate_s": 0.4, "time/learner_s": 0.8,
         "time/sync_s": 0.01}
        for s in range(2, steps + 1)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [first, {"eval/pass@1": 0.5}, *rest]))
    return tmp_path


def test_costs_per_sample_leave_out_the_first_step_and_scale_to_the_planned_sides(tmp_path):
    costs = measured_costs(_run(tmp_path))
    # 16 samples per engine: 1.6 / 16 s a sample on an engine, 0.4 / 16 of it generating; 32 on the one rank.
    assert costs.engine_s == pytest.approx(0.1) and costs.generate_s == pytest.approx(0.025)
    assert costs.learner_s == pytest.approx(0.025) and costs.sync_s == pytest.approx(0.01)
    # Planned: 16 x 8 = 128 samples a step on 8 engines and 2 ranks.
    cfg = load_config(CONFIG, ["rollout.prompts_per_step=16", "rollout.group_size=8"])
    b = expected_balance(costs, cfg, engines=8, ranks=2)
    assert b["rollout_s"] == pytest.approx(1.6) and b["generating_s"] == pytest.approx(0.4)
    assert b["update_s"] == pytest.approx(1.6)
    assert b["batch_k0_s"] == pytest.approx(3.21) and b["batch_k1_s"] == pytest.approx(1.61)
    assert b["stream_s"] == pytest.approx(1.61)  # max(generating 0.4, update 1.6): the learner bounds it


def test_plan_measured_prints_the_balance_and_names_the_bottleneck(tmp_path):
    run = _run(tmp_path)
    res = cli("plan", CONFIG, "--nodes", '[{"CPU": 8}]', "rollout.num_workers=4", "--measured", str(run))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "4 engine(s)" in out.splitlines()[0]
    # The calculator config's step on 4 engines and 1 rank, from the run's per-sample costs.
    cfg = load_config(CONFIG, ["rollout.num_workers=4"])
    b = expected_balance(measured_costs(run), cfg, engines=4, ranks=1)
    assert f"rollout {b['rollout_s']:.2f} s on 4 engine(s)" in out and f"update {b['update_s']:.2f} s" in out
    assert re.search(rf"batch, k=1 +~{b['batch_k1_s']:.2f} s a step", out)
    assert re.search(rf"stream +at best ~{b['stream_s']:.2f} s a step", out)
    assert ("the engines are the bottleneck" in out) == (b["rollout_s"] > b["update_s"])
    as_json = json.loads(cli("plan", CONFIG, "--json", "--measured", str(run)).stdout)
    assert as_json["balance"]["stream_s"] > 0 and len(as_json["engines"]) >= 1


def test_a_measurement_it_cannot_read_is_a_one_line_error(tmp_path):
    assert "no config.json" in one_line_error(cli("plan", CONFIG, "--measured", str(tmp_path)))
    (tmp_path / "stream").mkdir()
    stream = _run(tmp_path / "stream", pipeline="stream")
    assert "sync.pipeline=batch" in one_line_error(cli("plan", CONFIG, "--measured", str(stream)))
    with pytest.raises(ConfigError, match="at least 3 steps"):
        measured_costs(_run(tmp_path, steps=1))
