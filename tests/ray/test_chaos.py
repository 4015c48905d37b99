"""Chaos during real training runs (real Ray, vLLM and learner): a rollout worker's or an env host's process is
killed (SIGKILL) or frozen (SIGSTOP) while a step's rollout is out. Ray restarts the actor (`max_restarts`), the pool
redoes the lost rollout call with the same rows and seed after loading the latest weights (rollout/recovery.py), and
a frozen actor is found by its deadline (deadlines.py) and killed. Each run must complete every step, log each step
exactly once, and end with the very weights of an uninterrupted run with the same seed (on-policy: the run is
deterministic, so any lost or changed trajectory would change them)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import ray
import torch
from builders import TINY_RUN
from safetensors.torch import load_file

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.pool import RolloutPool

STEPS = 3
SMALL = [
    *TINY_RUN,
    "sync.max_staleness=0",
    f"run.steps={STEPS}",
    # Deadlines short enough that a frozen engine is found in well under a minute, long enough for healthy work.
    "env.tool_timeout_s=2",
    "recovery.decode_step_s=0.1",
    "recovery.slack_s=10",
]


def _run(tmp_path, name, chaos=None, extra=()):
    """Train with a pool the test can reach; `chaos(pool)` runs in a thread beside the run. Returns (final weights,
    metrics records, the pool's actor pids before and after). `extra`: overrides that change no result (deadlines)."""
    cfg = load_config(None, [*SMALL, *extra, f"run.output_dir={tmp_path}", f"run.name={name}"])
    pool = RolloutPool.create(cfg, str(_model_path(cfg)))
    try:
        before = _pids(pool)
        thread = threading.Thread(target=chaos, args=(pool, cfg.run_dir), daemon=True) if chaos else None
        if thread:
            thread.start()
        t0 = time.perf_counter()
        train(cfg, pool=pool)
        wall = time.perf_counter() - t0
        if thread:
            thread.join(timeout=5)
        after = _pids(pool)
    finally:
        pool.shutdown()
    records = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return _final_weights(cfg.run_dir), records, before, after, wall


def _final_weights(run_dir):
    """Copied out of the file: safetensors maps it, and the resume tests cut it short afterwards."""
    weights = load_file(str(run_dir / f"checkpoint_{STEPS:06d}" / "model" / "model.safetensors"))
    return {k: v.clone() for k, v in weights.items()}


def _model_path(cfg):
    from agentrl_ray.builtin.resolve import resolve_model

    return resolve_model(cfg.model.path)


def _pids(pool):
    return ray.get([a.pid.remote() for a in pool.workers + pool.env_hosts], timeout=600)


def _when_rollout_is_out(pool, run_dir, after_step=1):
    """Wait until step `after_step` is logged and the next step's environments are open on the env host: the
    rollout call is then in flight."""
    path = run_dir / "metrics.jsonl"
    while True:
        try:
            steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
        except (OSError, ValueError):  # not written yet, or a line half written
            steps = []
        if steps and max(steps) >= after_step and ray.get(pool.env_hosts[0].stats.remote())["open"] > 0:
            return time.perf_counter()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(local_ray, builtin_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos")
    weights, records, _, _, wall = _run(out, "reference")
    print(f"\nreference run: {wall:.1f} s, step times {[round(r['time/step_s'], 1) for r in records]}")
    return weights, records, out, wall


def _check_same_run(reference, weights, records, label):
    ref_weights, ref_records = reference[:2]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # every step, exactly once
    assert [r["reward/mean"] for r in records] == [r["reward/mean"] for r in ref_records]
    diffs = {k: float((weights[k].double() - ref_weights[k].double()).abs().max()) for k in ref_weights}
    worst = max(diffs, key=diffs.get)
    print(f"{label}: largest weight difference to the uninterrupted run {diffs[worst]:.3g} ({worst})")
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights), f"{worst} differs by {diffs[worst]}"


def _report(label, records, reference):
    """Recovery cost: how much longer the slowest step took than the same step of the uninterrupted run."""
    ref_steps = [r["time/step_s"] for r in reference[1]]
    steps = [r["time/step_s"] for r in records]
    extra = max(s - r for s, r in zip(steps, ref_steps))
    print(f"{label}: step times {[round(s, 1) for s in steps]} s, uninterrupted {[round(s, 1) for s in ref_steps]} s")
    print(f"{label}: recovery took ~{extra:.1f} s")


@pytest.mark.integration
def test_killed_actors_are_restarted_and_their_lost_work_redone(reference, tmp_path):
    """One run, two kills: the rollout worker during step 2's rollout, then the env host during step 3's. Each is
    restarted by Ray while the other is left alone, and the run ends with the uninterrupted run's weights."""
    seen = {}

    def chaos(pool, run_dir):
        worker, host = pool.workers[0], pool.env_hosts[0]
        first = ray.get([worker.pid.remote(), host.pid.remote()])
        _when_rollout_is_out(pool, run_dir, after_step=1)
        os.kill(first[0], signal.SIGKILL)
        _when_rollout_is_out(pool, run_dir, after_step=2)  # step 2 done: the worker was restarted and redid it
        seen["after worker kill"] = ray.get([worker.pid.remote(), host.pid.remote()])
        os.kill(seen["after worker kill"][1], signal.SIGKILL)
        seen["first"] = first

    weights, records, before, after, wall = _run(tmp_path, "killed", chaos)
    first, middle = seen["first"], seen["after worker kill"]
    assert first == before and middle[0] != first[0] and middle[1] == first[1]  # the worker restarted, host left
    assert len(after) == 2 and after[0] == middle[0] and after[1] != middle[1]  # the host restarted, worker left
    _report("SIGKILL rollout worker, then env host", records, reference)
    _check_same_run(reference, weights, records, "SIGKILL rollout worker, then env host")


def _thaw(pids):
    """Never leave a stopped process behind if recovery failed."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@pytest.mark.long
def test_a_frozen_rollout_worker_is_killed_at_its_deadline(reference, tmp_path):
    stopped = []

    def chaos(pool, run_dir):
        pid = ray.get(pool.workers[0].pid.remote())
        _when_rollout_is_out(pool, run_dir)
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

    try:
        # Tighter bounds find the frozen engine sooner: a decode step of this tiny model takes milliseconds and a
        # healthy rollout call here ~2 s, the first included, so 0.02 s a step and a 5 s slack (the call's deadline
        # ~20 s, then ~6 s for the ping that confirms it is stuck; with the 10 s slack 25 + 11 s).
        tight = ["recovery.decode_step_s=0.02", "recovery.slack_s=5"]
        weights, records, before, after, wall = _run(tmp_path, "frozen", chaos, tight)
    finally:
        _thaw(stopped)
    assert stopped and after[0] != before[0]  # the frozen engine was killed at its deadline and restarted
    _report("SIGSTOP rollout worker", records, reference)
    _check_same_run(reference, weights, records, "SIGSTOP rollout worker")


def _crash_after_checkpoint(out, name, last=STEPS - 1):
    """What a driver killed while writing checkpoint `last + 1` leaves: that checkpoint's weights cut short (resume
    moves it aside, resume.py) and metrics.jsonl ending in half a line."""
    torn = out / name / f"checkpoint_{last + 1:06d}" / "model" / "model.safetensors"
    torn.write_bytes(torn.read_bytes()[:1000])
    with (out / name / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "rew')


def _learner_pids():
    """This test's Ray Train worker processes (Ray titles an actor's process `ray::<class>...`): only descendants of
    this process, which started the local Ray (never another run's on a shared machine)."""
    import psutil

    pids = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if any("RayTrainWorker" in part for part in proc.cmdline()):
                pids.append(proc.pid)
        except psutil.Error:  # gone meanwhile
            pass
    return pids


@pytest.mark.long
def test_a_frozen_then_a_killed_learner_worker_resume_from_the_latest_checkpoint(reference, tmp_path):
    """One run, two learner failures (one run start instead of two):
    - during step 2's rollout the learner worker is frozen (SIGSTOP): Ray Train's health check of it hangs, and past
      `recovery.learner_unresponsive_s` the controller declares it dead, kills it, and FailureConfig restarts the
      learner from checkpoint 1;
    - during step 3's rollout the restarted learner is killed (SIGKILL): FailureConfig restarts it from checkpoint 2
      (`recovery.max_learner_failures=2`: two failures allowed; the default is one).
    Each dead learner's rollout call still runs on the engine, and the new learner's waits for it (one rollout call
    at a time per worker); the rollout worker and env host are left alone."""
    import psutil

    frozen, killed = [], []

    def chaos(pool, run_dir):
        _when_rollout_is_out(pool, run_dir, after_step=1)
        for pid in _learner_pids():
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
        _when_rollout_is_out(pool, run_dir, after_step=2)  # step 2 redone by the restarted learner
        killed.extend(pid for pid in _learner_pids() if pid not in frozen)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)

    try:
        weights, records, before, after, wall = _run(
            tmp_path, "learner", chaos, ["recovery.learner_unresponsive_s=10", "recovery.max_learner_failures=2"]
        )
        gone = [not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in frozen]
    finally:
        _thaw(frozen)
    assert frozen and all(gone)  # the frozen learner was killed at its deadline
    assert killed and not set(killed) & set(frozen)  # the second failure hit the restarted learner
    assert after == before  # the rollout worker and env host were left alone
    # Its step times are the new attempts': the restarts show in the run's wall time instead.
    print(f"SIGSTOP, then SIGKILL learner worker: run took {wall:.1f} s, uninterrupted {reference[3]:.1f} s")
    _check_same_run(reference, weights, records, "SIGSTOP, then SIGKILL learner worker")


_RUN_MARKER = "AGENTRL_TEST_KILLED_RUN"  # in the environment of every process of the run the test kills


def _run_processes(pid: int, marker: str) -> list:
    """The live processes of a run: `pid`, its descendants, and any process with `marker` in its environment."""
    import psutil

    found = {}
    try:
        found = {p.pid: p for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]}
    except psutil.Error:
        pass
    for proc in psutil.process_iter():
        try:
            if proc.pid not in found and proc.environ().get(_RUN_MARKER) == marker:
                found[proc.pid] = proc
        except psutil.Error:  # gone meanwhile, a zombie, or not ours to read
            pass
    return [p for p in found.values() if _alive(p)]


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _freeze_then_kill(driver, marker: str) -> None:
    """SIGKILL the driver and every process it started (its local Ray, engines, learner: a head machine that dies).
    The tree is frozen first (SIGSTOP, process by process as it is found), so that no step ends while it is listed.
    A process is the run's if it descends from the driver or carries `marker` in its environment (every process of
    the run inherits it): a worker the raylet was starting while the tree was listed once escaped the listing and
    was left running for good (a `ray::TrainController`, parent 1, after its raylet was gone)."""
    import psutil

    frozen, seen = [], set()
    while True:  # a process may start children while its parents are being frozen: list again until none is new
        tree = _run_processes(driver.pid, marker)
        if not tree:
            break
        new = [p for p in tree if p.pid not in seen]
        if not new:
            break
        for proc in new:
            seen.add(proc.pid)
            try:
                proc.suspend()
                frozen.append(proc)
            except psutil.Error:  # gone meanwhile
                pass
    for proc in frozen:
        try:
            proc.kill()
        except psutil.Error:
            pass


def _committed(run_dir, checkpoint: str) -> bool:
    """Ray Train's snapshot names `checkpoint` as its latest (a checkpoint not yet in it was never committed)."""
    try:
        snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
        return snapshot["latest_checkpoint_result"]["checkpoint_dir_name"] == checkpoint
    except (OSError, ValueError, KeyError, TypeError):  # not there yet, or caught mid-write
        return False


def kill_the_driver_once_committed(cli: list[str], tmp_path, run_dir, checkpoint: str, steps: int) -> dict:
    """Start `cli` (`agentrl-ray train` as its own process, with its own local Ray) and SIGKILL it with everything it
    started once `checkpoint` is committed; check that nothing of the run is left and that it had steps to go.
    Returns the environment to resume it in."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray, as a user's run
    marker, log_path = str(tmp_path), tmp_path / "driver.log"
    with log_path.open("wb") as log:  # a file, not a pipe: vLLM's logs would fill a pipe and block it
        driver = subprocess.Popen(
            cli, env={**env, _RUN_MARKER: marker}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while not _committed(run_dir, checkpoint):
                assert driver.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.02)
            _freeze_then_kill(driver, marker)
            driver.wait(timeout=60)
        finally:
            if driver.poll() is None:
                driver.kill()
    assert driver.returncode == -signal.SIGKILL, log_path.read_text()[-3000:]
    deadline = time.monotonic() + 10  # SIGKILLed processes leave the process table once they are reaped
    while (left := _run_processes(driver.pid, marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, [(p.pid, p.name()) for p in left]  # the dead head left nothing of the run behind
    done_before = sorted(p.name for p in run_dir.glob("checkpoint_*"))
    print(f"driver SIGKILL: checkpoints on disk when it died: {done_before}")
    assert f"checkpoint_{steps:06d}" not in done_before, "the run ended before the kill: nothing to resume"
    return env


@pytest.mark.long
def test_a_killed_driver_process_resumes_bit_identical(reference, tmp_path):
    """`agentrl-ray train` as its own process is SIGKILLed with everything it started once checkpoint 2 is committed
    (step 3 under way or not begun); what a kill while writing it would leave is then made on disk: checkpoint 2's
    weights cut short and metrics.jsonl ending in half a line. `run.resume=true` in a new process moves checkpoint 2
    aside, resumes from checkpoint 1 and ends with the uninterrupted run's weights."""
    import subprocess
    import sys

    cli = [sys.executable, "-m", "agentrl_ray.cli", "train", *SMALL, f"run.output_dir={tmp_path}", "run.name=driver"]
    run_dir = tmp_path / "driver"
    env = kill_the_driver_once_committed(cli, tmp_path, run_dir, "checkpoint_000002", STEPS)
    _crash_after_checkpoint(tmp_path, "driver", last=1)
    # --verbose: everything on the console (infra/console.py), Ray's and the resume's own lines included.
    done = subprocess.run([*cli, "run.resume=true", "--verbose"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Started a local Ray instance" in done.stderr and "log.txt" not in done.stdout
    print("\n".join(line for line in done.stderr.splitlines() if "agentrl_ray.run.resume" in line))  # what resume did
    assert len(list(run_dir.glob("checkpoint_000002.corrupt-*"))) == 1  # the torn checkpoint, moved aside
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    _check_same_run(reference, _final_weights(run_dir), records, "driver SIGKILL, then run.resume=true")
