"""The Ray a run starts for itself (no RAY_ADDRESS and no `ray start` cluster on this machine): no dashboard.

The dashboard and its module processes add ~1 GiB of summed RSS and ~2 s to every local start (docs/benchmarks.md),
and a local run is watched through its progress lines, metrics and plots. A cluster's own dashboard (`ray start`,
`ray up`, `ray job submit`, which `ray.init()` joins) is left as it is.

Without the dashboard there is no state API, which Ray Train's placement-group cleaner polls every second: it asks
whether Ray Train's controller is alive, to remove the learner's placement group should the controller die
ungracefully, and logs a warning each time the state API cannot answer. In a local run the driver owns the whole Ray
instance and ends it with the run, so nothing outlives the controller: the cleaner's logger is raised to ERROR in
every process of the run (`quiet_state_api_pollers`, Ray's worker setup hook). Ray Train's other state-API user, the
state actor, only exists with RAY_TRAIN_ENABLE_STATE_TRACKING=1 (off by default).
"""

from __future__ import annotations

import logging

_POLLER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_state_api_pollers() -> None:
    """Ray's `worker_process_setup_hook` for a local run: runs once in every worker process as it starts."""
    logging.getLogger(_POLLER).setLevel(logging.ERROR)


def runtime_env(env_vars: dict[str, str]) -> dict:
    """The job's runtime environment for a local run: the run's variables and the hook above."""
    return {"env_vars": env_vars, "worker_process_setup_hook": f"{__name__}.{quiet_state_api_pollers.__name__}"}
