"""The ETA prices what is left by the median step and evaluation (infra/console.py's `Progress`), never by the time
since start-up over the steps done: step 1 of a run once showed `eta 49:03` for a run that ended 70 s later.
A fake clock stands in for time; nothing sleeps."""

import io
import json

from agentrl_ray.infra import console
from agentrl_ray.infra.console import NO_ETA, Progress
from agentrl_ray.run.step_lines import StepLines, eval_steps


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _plain(monkeypatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.setattr(console, "out", lambda: stream)
    return stream


def test_a_slow_start_then_fast_steps_gives_the_steps_left_times_the_median_step(monkeypatch):
    _plain(monkeypatch)
    clock = Clock()
    p = Progress(50, "training", clock=clock)
    clock.now += 300.0  # model load, Ray, engines, then step 1
    p.update(1)
    assert p.eta() == NO_ETA  # step 1's gap is mostly start-up: no ETA yet
    for seconds in (2.0, 2.0, 9.0, 2.0):  # one slow step (a checkpoint) does not move the median
        clock.now += seconds
        p.update(1)
    assert p.eta_seconds() == 45 * 2.0
    assert p.eta() == "1:30"


def test_measured_step_times_are_used_and_the_eta_shows_from_step_2(monkeypatch):
    stream = _plain(monkeypatch)
    clock = Clock()
    p = Progress(10, "training", clock=clock)
    clock.now += 500.0
    p.update(1, line="step 1", step_s=3.0)
    clock.now += 5.0  # the console saw it late: the measured time counts, not the gap
    p.update(1, line="step 2", step_s=1.0)
    assert stream.getvalue().splitlines() == ["step 1 | eta --:--", "step 2 | eta 0:16"]  # 8 left x median(3, 1)


def test_evaluations_are_priced_apart_and_at_zero_before_the_first(monkeypatch):
    _plain(monkeypatch)
    p = Progress(20, "training", eval_steps=eval_steps(20, 5), clock=Clock())
    assert p.eval_steps == [5, 10, 15, 20]
    for _ in range(1, 5):
        p.update(1, step_s=1.0)
    assert p.eta_seconds() == 16 * 1.0  # no evaluation has run: priced at 0
    p.update(1, step_s=1.0, eval_s=30.0)  # step 5 and its evaluation
    assert p.eta_seconds() == 15 * 1.0 + 3 * 30.0  # the evaluations after steps 10, 15 and 20
    for step in range(6, 11):
        p.update(1, step_s=1.0, eval_s=10.0 if step == 10 else None)
    assert p.eta_seconds() == 10 * 1.0 + 2 * 20.0  # median of 30 and 10
    for _ in range(11, 21):
        p.update(1, step_s=1.0)
    assert p.eta() == "0:00"


def test_a_resumed_run_shows_no_eta_until_its_second_step(monkeypatch):
    _plain(monkeypatch)
    p = Progress(10, "training", initial=6, eval_steps=eval_steps(10, 5), clock=Clock())
    p.update(1, step_s=2.0)
    assert p.eta() == NO_ETA
    p.update(1, step_s=2.0)
    assert p.eta_seconds() == 2 * 2.0  # the evaluation after step 10 is unpriced: none has run in this session


def test_eval_steps_follow_the_learners_schedule():
    assert eval_steps(25, 10) == [10, 20, 25]
    assert eval_steps(20, 10) == [10, 20]
    assert eval_steps(7, 0) == [7]  # run.eval_every=0: only at the end


def test_the_bar_shows_our_eta(monkeypatch):
    stream = Terminal()
    monkeypatch.setattr(console, "out", lambda: stream)
    clock = Clock()
    p = Progress(10, "training", clock=clock)
    clock.now += 100.0
    p.update(1, line="step 1")
    clock.now += 2.0
    p.update(1, line="step 2")
    p.close()
    frames = stream.getvalue().split("\r")
    assert any("1/10 [" in f and "<--:--" in f for f in frames), frames
    assert any("2/10 [" in f and "<0:16" in f for f in frames), frames  # 8 left x 2 s


STEP = {
    "reward/mean": 0.5,
    "rollout/success": 0.5,
    "rollout/sampled_tokens": 120,
    "time/learner_s": 0.5,
    "time/sync_s": 0.01,
    "time/rollout_s": 0.1,
}


def test_step_lines_price_steps_by_their_time_and_evaluations_by_the_gap_they_add(tmp_path, monkeypatch):
    stream = _plain(monkeypatch)
    path = tmp_path / "metrics.jsonl"
    lines = StepLines(path, total_steps=6, eval_every=2)
    records = [
        {"step": 0, "time": 95.0, "eval/success": 0.1},  # the evaluation before training, after the start-up
        {"step": 1, "time": 100.0, **STEP, "time/step_s": 5.0},
        {"step": 2, "time": 113.0, **STEP, "time/step_s": 3.0, "eval/success": 0.2},  # evaluation: 13 - 3 = 10 s
        {"step": 3, "time": 116.0, **STEP, "time/step_s": 3.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    lines.close()
    etas = [line.rsplit(" | eta ", 1)[1] for line in stream.getvalue().splitlines()[1:]]
    # step 2: 4 steps x median(5, 3) + evaluations after steps 4 and 6 x 10 s; step 3: 3 x 3 + 2 x 10
    assert etas == [NO_ETA, "0:36", "0:29"]
