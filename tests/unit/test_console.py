"""The console is the user's (infra/console.py): our lines on screen, everything else in the run's log file; step
lines under a progress bar on a terminal, plain lines with an ETA elsewhere (run/step_lines.py)."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agentrl_ray.infra import console
from agentrl_ray.infra.console import Progress, eta_text
from agentrl_ray.run.step_lines import StepLines, step_line

ROOT = Path(__file__).resolve().parents[2]

QUIET = """
import logging, os, subprocess, sys
from pathlib import Path
from agentrl_ray.infra import console

logging.basicConfig(level=logging.INFO)  # as the CLI does, before the console goes quiet
with console.quiet(Path(sys.argv[1])):
    print("python print")  # a library's print: sys.stdout, i.e. descriptor 1
    logging.getLogger("ray").info("a library's log line")
    os.write(2, b"native stderr\\n")  # a C library's warning
    subprocess.run(["sh", "-c", "echo child stdout; echo child stderr >&2"])  # a process started meanwhile
    console.say("step    1/2 | ours")
    logging.getLogger("agentrl_ray.x").warning("act on this")
    logging.getLogger("agentrl_ray.x").info("an info line of ours")
print("after: back on screen")
if len(sys.argv) > 2:
    with console.quiet(Path(sys.argv[1])):
        raise RuntimeError("crash inside")
"""


def _quiet(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "run" / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", QUIET, str(log), *extra], capture_output=True, text=True, env=env)
    return done, log.read_text()


def test_quiet_sends_every_writer_but_ours_to_the_file(tmp_path):
    done, logged = _quiet(tmp_path)
    assert done.returncode == 0, done.stderr
    screen = done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == (
        f"agentrl-ray: the output of Ray, vLLM, DeepSpeed and transformers goes to {tmp_path / 'run' / 'log.txt'} "
        "(--verbose shows it here)"
    )
    assert "step    1/2 | ours" in done.stdout and "after: back on screen" in done.stdout
    assert "agentrl-ray: act on this" in screen  # our warning on screen, and in the file
    for line in ("python print", "a library's log line", "native stderr", "child stdout", "child stderr"):
        assert line in logged and line not in screen, line
    assert "act on this" in logged and "an info line of ours" in logged and "an info line of ours" not in screen
    assert "step    1/2" not in logged


def test_a_crash_inside_quiet_shows_its_traceback(tmp_path):
    done, _ = _quiet(tmp_path, "crash")
    assert done.returncode == 1
    assert "RuntimeError: crash inside" in done.stderr and "Traceback" in done.stderr


def test_outside_quiet_our_lines_go_to_stdout(capsys):
    assert console.log_file() is None
    console.say("hello")
    assert capsys.readouterr().out == "hello\n"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_plain_lines_with_an_eta_off_a_terminal(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(console, "out", lambda: stream)
    p = Progress(10, "building", every=5)
    for i in range(10):
        p.update(1, note=f"loss {i}")
    p.update(0, line="step    3/10 | ours")
    p.write("an eval line")
    p.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(" | eta ")[0] for line in lines] == [
        "building 5/10 loss 4",
        "building 10/10 loss 9",
        "step    3/10 | ours",
        "an eval line",
    ]
    assert lines[1].endswith("| eta 0:00")


def test_progress_is_a_bar_on_a_terminal(monkeypatch):
    stream = Terminal()
    monkeypatch.setattr(console, "out", lambda: stream)
    p = Progress(4, "training", initial=1)
    p.update(1, line="step    2/4 | ours")
    p.close()
    text = stream.getvalue()
    assert "step    2/4 | ours\n" in text and "training:" in text and "2/4" in text and "\r" in text


def test_eta_text():
    assert eta_text(0) == "0:00" and eta_text(83) == "1:23" and eta_text(3725) == "1:02:05"


STEP = {
    "reward/mean": 0.5,
    "rollout/success": 0.5,
    "rollout/sampled_tokens": 120,
    "time/step_s": 1.0,
    "time/learner_s": 0.5,
    "time/sync_s": 0.01,
    "time/rollout_s": 0.1,
}


def _append(path: Path, *records: dict) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_step_lines_follow_metrics_jsonl(tmp_path, monkeypatch):
    """New records become lines; a resumed run's earlier records are not shown again, nor are records the resumed
    learner keeps when it rewrites the file."""
    stream = io.StringIO()
    monkeypatch.setattr(console, "out", lambda: stream)
    path = tmp_path / "metrics.jsonl"
    _append(path, {"step": 1, "time": 1.0, **STEP})  # the run resumed from here
    lines = StepLines(path, total_steps=3)
    assert lines.progress.done == 1
    path.write_text(json.dumps({"step": 1, "time": 1.0, **STEP}) + "\n")  # truncate_after: rewritten, smaller
    _append(path, {"step": 2, "time": 2.0, **STEP})
    time.sleep(0.05)
    _append(path, {"step": 3, "time": 3.0, **STEP, "eval/success": 0.75})
    lines.close()
    shown = stream.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in shown] == ["step    2/3", "step    3/3"], shown
    assert "| eval success 0.750" in shown[1]
    assert lines.progress.done == 3


def test_the_evaluation_before_training_has_its_own_line():
    m = {"eval/success": 0.25, "eval/pass@1_ci95_lo": 0.1, "eval/pass@1_ci95_hi": 0.4}
    assert step_line(0, m, 50) == "step    0/50 | eval success 0.250 (pass@1 95% CI 0.100-0.400) (before training)"
    assert step_line(7, {**STEP, "health/level": 1, "health/reasons": "why"}, 50).endswith("| health WARN: why")


def test_step_lines_survive_a_rewrite_that_grows_past_the_offset_and_a_torn_line(tmp_path, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(console, "out", lambda: stream)
    path = tmp_path / "metrics.jsonl"
    lines = StepLines(path, total_steps=4)
    _append(path, {"step": 1, "time": 1.0, **STEP}, {"step": 2, "time": 2.0, **STEP})
    lines.show_new()
    replaced = tmp_path / "new.jsonl"  # truncate_after's atomic replace, then more steps before the next look
    _append(replaced, {"step": 1, "time": 1.0, **STEP}, {"step": 2, "time": 5.0, **STEP})
    with replaced.open("a") as f:
        f.write('{"step": 3, "rew\n')  # torn by a crash
    _append(replaced, {"step": 3, "time": 6.0, **STEP}, {"step": 4, "time": 7.0, **STEP})
    replaced.replace(path)
    lines.close()
    shown = [line.split(" | ")[0] for line in stream.getvalue().splitlines()]
    assert shown == ["step    1/4", "step    2/4", "step    2/4", "step    3/4", "step    4/4"], shown
