"""The pipeline simulator (benchmarks/suite/rollout/pipeline_sim.py, `rollout --mode pipeline_timeline --project`)
against cases worked by hand: with no environment wait, one turn per episode and a batched call of fixed cost, each
pipeline's step is what its rules make it; a heavy-tailed environment then costs the batch pipeline its tail and the
stream one little."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from suite.rollout import pipeline_sim as ps  # noqa: E402

SHAPE = ps.Shape(engines=1, prompts_per_step=4, group_size=2)


def _costs(**kw):
    base = dict(t0=0.5, t1=0.0, learner_s=1.0, rho=0.0, turns=[1], env_median_s=0.0, env_sigma=0.0)
    return ps.Costs(**{**base, **kw})


def test_worked_cases_without_an_environment_wait():
    # sync: a call (0.5 s), then the update (1 s); one step off: the update hides the call; stream: the same bound.
    for mode, k, step in (("batch", 0, 1.5), ("batch", 1, 1.0), ("stream", 2, 1.0)):
        run = ps.Sim(_costs(), SHAPE, mode, k, steps=6).run()
        assert run["step_s"] == pytest.approx(step), (mode, k)
        assert run["trajectories_per_s"] == pytest.approx(8 / step), (mode, k)
    # On shared cores (rho 1) the overlapped update runs at half speed while the engine works beside it.
    assert ps.Sim(_costs(rho=1.0), SHAPE, "batch", 0, steps=6).run()["step_s"] == pytest.approx(1.5)
    assert ps.Sim(_costs(rho=1.0), SHAPE, "stream", 2, steps=6).run()["step_s"] > 1.0


def test_a_heavy_tail_costs_the_batch_pipeline_more_than_the_stream_one():
    tail = dict(turns=[2, 4, 6, 8], env_median_s=0.05, env_sigma=1.0, t0=0.05, t1=0.002, learner_s=0.3)
    out = ps.simulate(_costs(**tail), ps.Shape(engines=1, prompts_per_step=16, group_size=8), steps=10, seeds=2)
    assert out["sync"]["speedup_vs_sync"] == 1.0
    assert out["stream_k2"]["speedup_vs_sync"] > out["one_step_off"]["speedup_vs_sync"] > 1.0
    assert out["stream_k4"]["dropped_groups"] >= 0
