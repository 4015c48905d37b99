"""`init_ray`: join the cluster RAY_ADDRESS names, or the `ray start` cluster running on this machine, or start the
Ray a run starts for itself (neither): no dashboard, no preemption watcher, no idle workers started ahead.

A `ray start` cluster is joined only while it runs: Ray records its address in `<temp dir>/ray_current_cluster` and
removes the file on `ray stop`, but a cluster that was killed (a crashed `ray.cluster_utils.Cluster`, a machine's
processes ended) leaves it behind, and plain `ray.init()` would then try to join the dead cluster, or refuse a local
Ray's settings ("When connecting to an existing cluster, num_cpus ... must not be provided"). A run starts its own Ray
then (`address="local"`) and says that it ignored the stale record.

The dashboard and its module processes add ~1 GiB of summed RSS and ~2 s to every local start (docs/benchmarks.md),
and a local run is watched through its progress lines, metrics and plots. A cluster's own dashboard (`ray start`,
`ray up`, `ray job submit`, which `ray.init()` joins) is left as it is.

Without the dashboard there is no state API, which Ray Train's placement-group cleaner polls every second: it asks
whether Ray Train's controller is alive, to remove the learner's placement group should the controller die
ungracefully, and logs a warning each time the state API cannot answer. In a local run the driver owns the whole Ray
instance and ends it with the run, so nothing outlives the controller: the cleaner's logger is raised to ERROR in
every process of the run (`setup_worker`, Ray's worker setup hook). Ray Train's other state-API user, the
state actor, only exists with RAY_TRAIN_ENABLE_STATE_TRACKING=1 (off by default).

Two more processes that a one-machine run has no use for, each a Python process importing Ray (~190 MiB RSS and
~1-2 CPU-seconds at start, when every role competes for the cores; docs/benchmarks.md):
- Ray Train's preemption watcher, which polls for nodes being drained (spot instances) so that the learner restarts
  before its node goes: a local run is one node, and if it goes the run goes with it.
- the workers the raylet prestarts for the first driver: every actor of a run asks for its own runtime environment
  and process, so those idle workers are never used.
Ray Train's placement-group cleaner and autoscaling coordinator are left out of the learner's trainer in the same
Ray (`started_here`; infra/ray_train.py).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl_ray.config import Config
    from agentrl_ray.infra.threads import ThreadPolicy

log = logging.getLogger(__name__)
_POLLER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
LOG_ENV = "AGENTRL_LOG_FILE"
_STARTED: str | None = None  # the GCS address of the Ray init_ray started, if it did


def setup_worker() -> None:
    """Ray's `worker_process_setup_hook` for a local run: runs once in every worker process as it starts."""
    logging.getLogger(_POLLER).setLevel(logging.ERROR)
    path = os.environ.get(LOG_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def runtime_env(env_vars: dict[str, str], log_file: str | None = None) -> dict:
    """The job's runtime environment for a local run: the run's variables, no preemption watcher (a value the user
    exported wins), the log file if any, and the hook above."""
    env = {_WATCHER: os.environ.get(_WATCHER, "0"), **env_vars, **({LOG_ENV: log_file} if log_file else {})}
    return {"env_vars": env, "worker_process_setup_hook": f"{__name__}.{setup_worker.__name__}"}


# Ray's own settings for the instance a local run starts (`ray.init(_system_config=...)`).
SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


def running_cluster_address(quiet: bool = False) -> str | None:
    """The GCS address of the `ray start` cluster this machine runs, or None: the address Ray recorded at `ray start`,
    if a GCS process serving it is still up. A stale record is ignored, and said so unless `quiet`: a run that starts
    its own Ray says why; reading a config (cluster_hardware.py) keeps a user's one-line errors one line."""
    # Where Ray keeps the record (ray._common.utils.get_ray_address_file): checked before importing Ray, so that
    # parsing a config without a cluster stays light (cluster_hardware.py).
    tmp = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    if not os.path.exists(os.path.join(tmp or "/tmp", "ray", "ray_current_cluster")):
        return None
    from ray._private import services

    recorded = services.find_bootstrap_address(None)
    if not recorded:
        return None
    services.find_gcs_addresses.cache_clear()
    if recorded in services.find_gcs_addresses():
        return recorded
    log.log(
        logging.DEBUG if quiet else logging.WARNING,
        "ignoring Ray's record of a cluster at %s: no GCS runs there (a cluster that was killed)",
        recorded,
    )
    return None


def cluster_address(quiet: bool = False) -> str | None:
    """The cluster a run joins: RAY_ADDRESS if set, else the running `ray start` cluster, else None (a local Ray)."""
    return os.environ.get("RAY_ADDRESS") or running_cluster_address(quiet)


def init_ray(cfg: Config, threads: ThreadPolicy, log_file: str | None = None) -> None:
    """Join the cluster RAY_ADDRESS names or the `ray start` cluster on this machine, else start the local Ray
    described above; nothing when Ray is up. `log_file`: the console is quiet (console.py); the workers' output goes
    there, not to the driver."""
    import ray

    if ray.is_initialized():
        return
    env_vars = threads.actor_env()
    if os.environ.get("PYTHONPATH"):  # the user's folders (user_code.py), for every worker that imports user code
        env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
    forward = log_file is None
    address = cluster_address()
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=forward)
    else:
        env = runtime_env(env_vars, log_file)
        start_local_ray(
            dict(
                address="local",
                include_dashboard=False,
                runtime_env=env,
                _system_config=SYSTEM_CONFIG,
                log_to_driver=forward,
            )
        )
        global _STARTED
        _STARTED = ray.get_runtime_context().gcs_address


START_ATTEMPTS = 3
_TIMED_OUT = "timed out during startup"  # ray/_private/node.py: the raylet did not register within its fixed 30 s


def start_local_ray(init_args: dict, attempts: int = START_ATTEMPTS) -> None:
    """`ray.init` of a local Ray, tried again when its node timed out during start-up. Ray waits a fixed 30 s for the
    raylet to register with the GCS, which a busy machine can exceed (seen at load ~7 on 2 cores: "The current node
    timed out during startup ... GCS has become overloaded"); the same run then starts alone. The half-started
    processes of a failed attempt are ended first, and the console says what happened."""
    import ray

    from agentrl_ray.infra import console

    for attempt in range(1, attempts + 1):
        try:
            ray.init(**init_args)
            return
        except Exception as err:
            if _TIMED_OUT not in str(err) or attempt == attempts:
                raise
            ended = _end_half_started_ray()
            load = os.getloadavg()[0]
            console.say(
                f"agentrl-ray: the local Ray did not start within Ray's 30 s (load {load:.1f} on {os.cpu_count()} "
                f"cores); ended its {ended} processes, trying again ({attempt + 1}/{attempts})"
            )


def _end_half_started_ray() -> int:
    """Kill the Ray processes a failed `ray.init` left as this process's children (GCS, raylet, agents, their
    workers); returns how many. Ray's own `shutdown` knows nothing of a node that never finished starting."""
    import psutil
    import ray

    ray.shutdown()
    ray_dir = os.path.dirname(ray.__file__)
    ours: dict[int, psutil.Process] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if any(ray_dir in arg for arg in child.cmdline()):  # GCS, raylet, agents (workers retitle themselves)
                ours.update({p.pid: p for p in [child, *child.children(recursive=True)]})
        except psutil.Error:
            pass
    for proc in ours.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(ours.values()), timeout=10)
    return len(ours)


def started_here() -> bool:
    """Whether the Ray this process is connected to is the local one `init_ray` started (one node, no autoscaler,
    ended with the run), not a cluster it joined or a Ray its caller started."""
    import ray

    return _STARTED is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == _STARTED
