"""Dead and stuck rollout workers and env hosts: Ray restarts them, the pool redoes their lost work.

Ray's own mechanism does the restart (`max_restarts`, from `recovery.max_actor_restarts`); this module does what Ray
cannot know: which rollout calls lost their work, which actor is stuck, and when to give up.
- A rollout call that fails because an actor died (the worker itself, or an env host it was waiting on: either way a
  `RayActorError`) is redone on the same worker, with the same rows and seed, after the latest weights are loaded.
  Every request's sampling seed depends only on (seed, trajectory key, turn), and the key on the worker's index, so
  the redone call returns the trajectories the lost one would have.
- A call not back by its deadline (`deadlines.py`) means a stuck actor: every actor is pinged; one that does not
  answer is killed (`ray.kill(no_restart=False)`, so Ray restarts it) and handled like a dead one.
- Each actor's process id tells restarts apart (also one Ray made between two calls, unseen by any caller); past
  `max_actor_restarts` of one actor the run stops with a message that names it.
Env hosts' calls are not idempotent (they hold per-trajectory state), so Ray never retries a task by itself
(`max_task_retries=0`): a whole rollout call is redone instead.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from agentrl_ray.envs.host import EnvHost
from agentrl_ray.infra import startup
from agentrl_ray.rollout.deadlines import Deadlines
from agentrl_ray.types import RunStopped

log = logging.getLogger("agentrl_ray")
DEAD_AFTER_S = 30.0  # an actor whose calls fail at once for this long is dead for good, not restarting


class RestartableEnvHost(EnvHost):
    """An env host that tells its process id (restarts change it; chaos tests kill it)."""

    def __init__(self, *args, **kwargs) -> None:
        startup.mark("env host", "actor built (imports done)")
        super().__init__(*args, **kwargs)
        startup.mark("env host", "ready")

    def pid(self) -> int:
        return os.getpid()


class ActorFailed(RunStopped):
    """An actor died past its restart bound (or Ray could not restart it): the run cannot go on."""


class Recovery:
    """The pool's actors by name, the process id each had when last seen, and how often each restarted."""

    def __init__(
        self, workers: list[Any], env_hosts: list[Any], deadlines: Deadlines, worker_restarts: int, host_restarts: int
    ) -> None:
        """`worker_restarts`/`host_restarts`: the `max_restarts` each role's actors were created with (workers get 0
        under the collective transport, env hosts keep `recovery.max_actor_restarts`)."""
        self.actors = {f"rollout worker {i}": w for i, w in enumerate(workers)}
        self.actors.update({f"env host {i}": h for i, h in enumerate(env_hosts)})
        self.bounds = {name: worker_restarts if name.startswith("rollout") else host_restarts for name in self.actors}
        self.deadlines = deadlines
        self.pids: dict[str, int] = {}
        self.restarts: Counter[str] = Counter()
        self.seconds_recovering = 0.0  # wall time spent in `recover` (reported by the chaos tests)
        # Redo rounds of one batch: each is caused by at least one restart, unless an actor is unreachable.
        self.max_rounds = sum(bound + 1 for bound in self.bounds.values()) + 1

    def remember(self) -> None:
        """Take every actor's process id as the healthy baseline (after creation)."""
        self.pids = self._pids(self.deadlines.actor_start_s)

    def wait(self, refs: dict[int, Any], timeout_s: float) -> tuple[dict[int, Any], list[int]]:
        """Results of the calls that succeeded by the deadline, and the keys of those that lost their work (an actor
        died, or was stuck and has been killed). Any other error is the caller's own and is raised."""
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        results: dict[int, Any] = {}
        lost = []
        for key, ref in refs.items():
            if ref not in done:
                lost.append(key)
                continue
            try:
                results[key] = ray.get(ref)
            except Exception as err:
                if not lost_to_an_actor(err):
                    raise
                log.warning("recovery: a rollout call lost its work: %s", _first_line(err))
                lost.append(key)
        stuck = {k: refs[k] for k in lost if refs[k] not in done}
        if stuck:
            log.warning("recovery: calls of rollout worker(s) %s passed their %.0f s deadline", list(stuck), timeout_s)
            self._unstick(stuck)
        return results, lost

    def recover(self) -> None:
        """After lost work: wait until every actor answers again (a restarting engine loads its model anew), count
        the restarts, and stop past the bound. Stuck actors were killed before (`wait`)."""
        t0 = time.perf_counter()
        pids = self._pids(self.deadlines.actor_start_s)
        for name, pid in pids.items():
            if pid != self.pids.get(name):
                self.restarts[name] += 1
                log.warning("recovery: %s restarted (%d of %d)", name, self.restarts[name], self.bounds[name])
        self.pids = pids
        self.seconds_recovering += time.perf_counter() - t0
        over = [n for n, k in self.restarts.items() if k > self.bounds[n]]
        if over:
            raise ActorFailed(self._bound_message(over[0]))

    def _unstick(self, stuck: dict[int, Any]) -> None:
        """Kill whatever does not answer; a call still out afterwards (its worker answers, but waits on something
        that never returns) gets its worker killed too, so that no old call runs beside its redo."""
        self._kill_silent()
        refs = list(stuck.values())
        _, still = ray.wait(refs, num_returns=len(refs), timeout=self.deadlines.probe_s)
        for index, ref in stuck.items():
            if ref in still:
                log.warning("recovery: killing rollout worker %d, whose rollout call never came back", index)
                ray.kill(self.actors[f"rollout worker {index}"], no_restart=False)
        if still:
            ray.wait(still, num_returns=len(still), timeout=self.deadlines.probe_s)

    def _pids(self, timeout_s: float) -> dict[str, int]:
        """Every actor's process id, waiting up to `timeout_s` for each to come back from a restart. A call that
        reaches an actor in the moment between its death and Ray's notice of it fails at once: it is repeated, for
        `DEAD_AFTER_S`; an actor that keeps failing so long is gone for good (past `max_restarts`). One that Ray
        reports as restarting (`ActorUnavailableError`) is waited for until `timeout_s`."""
        end = time.monotonic() + timeout_s
        pids = {}
        for name, actor in self.actors.items():
            failing_since = None
            while name not in pids:
                try:
                    pids[name] = ray.get(actor.pid.remote(), timeout=max(1.0, end - time.monotonic()))
                except GetTimeoutError as err:
                    message = f"{name} did not answer within {timeout_s:.0f} s (recovery.actor_start_s)"
                    raise ActorFailed(message) from err
                except ActorUnavailableError as err:
                    # Ray says "restarting": not dead, however long it takes (a lost node is noticed after Ray's
                    # health checks, then the actor waits for room on another node and loads its model anew).
                    if time.monotonic() > end:
                        message = f"{name} did not come back within {timeout_s:.0f} s (recovery.actor_start_s)"
                        raise ActorFailed(f"{message}: {_first_line(err)}") from err
                    time.sleep(1.0)
                except RayActorError as err:
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > DEAD_AFTER_S:
                        raise ActorFailed(f"{self._bound_message(name)}: {_first_line(err)}") from err
                    time.sleep(1.0)
        return pids

    def _kill_silent(self) -> None:
        """Kill every actor that does not answer a ping within `probe_s` (Ray restarts it)."""
        refs = {name: actor.pid.remote() for name, actor in self.actors.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.deadlines.probe_s)
        for name, ref in refs.items():
            if ref not in ready:
                log.warning("recovery: %s does not answer within %.0f s: killing it", name, self.deadlines.probe_s)
                ray.kill(self.actors[name], no_restart=False)

    def _bound_message(self, name: str) -> str:
        return (
            f"{name} failed and was restarted {self.restarts[name]} time(s); it may restart {self.bounds[name]} "
            "time(s) (recovery.max_actor_restarts; 0 for rollout workers under sync.transport=collective, whose "
            f"weight group cannot take a new member) (restarts so far: {dict(self.restarts) or 'none'})"
        )


def lost_to_an_actor(err: BaseException | None) -> bool:
    """Whether an actor's death (the worker's own, or one it called, e.g. an env host) failed this call: the error
    or any error in its chain of causes (a rollout's `RayTaskError` wraps the env host's) is a `RayActorError`."""
    while err is not None:
        if isinstance(err, RayActorError):
            return True
        err = getattr(err, "cause", None) or err.__cause__
    return False


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
