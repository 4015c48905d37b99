"""Shared fixtures. Tests in tests/ray start a real local Ray (CPU) and real vLLM engines: no mocks of either."""

import os
from pathlib import Path

import pytest

# Built models are cached per checkout so CI builds the default model once per run.
os.environ.setdefault("AGENTRL_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "agentrl_ray"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def builtin_model_path() -> str:
    from agentrl_ray.builtin.model import ensure_builtin_model

    return str(ensure_builtin_model())


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
