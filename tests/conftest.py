"""Shared fixtures. Tests in tests/ray start a real local Ray (CPU) and real vLLM engines: no mocks of either."""

import os
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


@pytest.fixture(scope="session")
def builtin_model_path() -> str:
    from agentrl_ray.builtin.model import ensure_builtin_model

    return str(ensure_builtin_model())


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
