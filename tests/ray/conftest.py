"""One local Ray for the whole tier: the modules that ask for `local_ray` share it, and run first.

Starting and stopping a local Ray costs several seconds on the 2-core CI machine; once per module that was a dozen
times per run. The modules that start a Ray of their own (a `ray.cluster_utils.Cluster`, `ray start` for job
submission, a run's own local Ray in a subprocess) run after them, with the shared Ray shut down first so that
nothing of it competes with theirs. A module that leaves CPUs reserved (an actor or a placement group not cleaned up,
e.g. after a failure) ends the shared Ray, and the next module gets a fresh one: one failure never blocks the rest.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import ray

RAY_ARGS = {
    "address": "local",  # never a cluster found on the machine (a `ray start` one, or the stale record of a killed one)
    "num_cpus": 4,
    "include_dashboard": False,
    "runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
}
HERE = Path(__file__).resolve().parent
_SHARED: set[str] = set()  # the modules that use the shared Ray


def pytest_collection_modifyitems(session, config, items):
    """Within this tier, the modules that share the Ray first (each module's tests stay together, in their order);
    the other tiers keep their places."""
    here = [i for i, item in enumerate(items) if item.path.parent == HERE]
    _SHARED.update(items[i].module.__name__ for i in here if "local_ray" in items[i].fixturenames)
    ordered = sorted((items[i] for i in here), key=lambda item: item.module.__name__ not in _SHARED)  # stable
    for i, item in zip(here, ordered):
        items[i] = item


@pytest.fixture(scope="session")
def _shared_ray():
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _own_ray_modules(request, _shared_ray):
    """A module that starts its own Ray (or none) finds no Ray of ours up."""
    if request.module.__name__ not in _SHARED and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def local_ray():
    if not ray.is_initialized():
        ray.init(**RAY_ARGS)
    yield ray
    if ray.is_initialized() and not _all_cpus_free():
        ray.shutdown()


def _all_cpus_free(wait_s: float = 10.0) -> bool:
    """Every CPU of the shared Ray free again (actors killed by the module's own teardown release theirs within a
    moment), placement groups included."""
    deadline = time.monotonic() + wait_s
    while True:
        free = ray.available_resources().get("CPU", 0.0) >= ray.cluster_resources().get("CPU", 0.0) - 1e-6
        if free or time.monotonic() > deadline:
            return free
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory):
    """The repository's files (tracked, and untracked ones git does not ignore) in a new folder: what a user's clone
    holds, without this checkout's data/, runs/ or caches."""
    root = HERE.parents[1]
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    dest = tmp_path_factory.mktemp("clone")
    for name in files:
        if (root / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, dest / name)
    return dest
