"""The streaming pipeline (`sync.pipeline=stream`): engines keep generating, the learner trains on the first complete
groups, weights reach the engines in flight.

The schedule is a sequence of slots: slot j is prompt j % P of step j // P (P = `rollout.prompts_per_step`; the
prompts and their order are the batch pipeline's, `PromptSampler`). Each slot is one rollout call of one group (G
samples of its prompt) on the least-loaded worker, which runs many such calls at once and batches their turns
(`rollout/turn_scheduler.py`). At most max(k, 1) * P slots are out beyond those consumed, with k =
`sync.max_staleness`: a slot sent while the learner holds version v is due by step v + k - 1 in schedule order,
which leaves a straggler one step of slack before the bound. (Sending (k + 1) * P, the most the bound allows, put
every slot at the bound on arrival: on the long-tail workload 58 of 234 groups went stale at k = 2, against 26 of
202, and the engine's extra work slowed the learner beside it: 100.6 against 109.8 trajectories/s; docs/async.md.)
A step takes the P complete groups of the lowest slots among those back (a group is complete when all its samples
are: GRPO normalizes over them), so a straggler delays only itself: the learner trains on the groups that
finished. A group whose oldest token is more than k versions behind the learner when taken is dropped and counted
(`rollout/stale_dropped`); its slot is consumed, the schedule goes on. With dynamic sampling on, a group whose rewards
are all equal is skipped (`rollout/filtered_groups`) and the step takes the next, within
`algorithm.max_resample_rounds` steps' worth of groups.

After each update the learner pushes its weights (`publish`): every engine loads them between two of its batched
calls, so episodes in flight continue on the new weights at their next turn (partial rollouts); each sampled token
records its version (`Trajectory.token_versions`).

A checkpoint records which slots were consumed (`state`); a resume issues the others again, so no group is trained
twice and every slot of the schedule is trained or counted as dropped. What was in flight at a kill is generated
again: a resumed streaming run is not bit-identical (the batch pipeline's is).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from agentrl_ray.config import Config
from agentrl_ray.learner.feed import PromptSampler, keep_varied
from agentrl_ray.rollout.recovery import ActorFailed, lost_to_an_actor
from agentrl_ray.types import RolloutTimings, RunStopped, TrajectoryGroup

log = logging.getLogger("agentrl_ray")


class StreamFeed:
    """Rank 0's source of each step's groups in the streaming pipeline (the `RolloutFeed` interface)."""

    def __init__(self, pool, sender, sampler: PromptSampler, cfg: Config) -> None:
        self.pool, self.sender, self.sampler, self.cfg = pool, sender, sampler, cfg
        self.per_step = cfg.rollout.prompts_per_step
        self.k = cfg.sync.max_staleness
        self.window = max(1, self.k) * self.per_step  # slots out beyond those consumed (`_issue`)
        self.next_slot = 0  # the lowest slot never issued
        self.base = 0  # every slot below it is consumed
        self.consumed_ahead: set[int] = set()  # consumed slots at or above `base`
        self.in_flight: dict[Any, tuple[int, int]] = {}  # rollout call -> (slot, worker index)
        self.back: dict[int, tuple[TrajectoryGroup, RolloutTimings]] = {}  # complete groups, by slot
        self.load = [0] * pool.num_workers  # calls out per worker
        self.loads: list[Any] = []  # weight loads sent and not yet seen finished
        self._rows: dict[int, list[dict[str, Any]]] = {}  # the sampler's rows of a step
        pool.resend_latest = True  # evaluations and probes carry the newest weights too (worker._receive_once)
        self.counts = {"stale_dropped": 0, "filtered_groups": 0, "regenerated_groups": 0, "trained_groups": 0}

    # ------------------------------------------------------------------------- the RolloutFeed interface

    def take(self, step: int, version: int) -> tuple[list[TrajectoryGroup], RolloutTimings, dict[str, float]]:
        """P complete groups for `step` (trained on by weights `version`), lowest slots first, with the slowest
        group's timings and the feed's stats."""
        self._issue()
        a = self.cfg.algorithm
        filtering = a.dynamic_sampling != "off"
        budget = self.per_step * (1 + (a.max_resample_rounds if a.dynamic_sampling == "resample" else 0))
        taken: list[tuple[int, TrajectoryGroup]] = []
        timings = RolloutTimings()
        seen = stale = filtered = 0
        while len(taken) < self.per_step and seen - stale < budget:  # stale groups are replaced, always
            while not self.back:
                self._wait()
            slot = min(self.back)
            group, t = self.back.pop(slot)
            self._consume(slot)
            seen += 1
            if version - group.min_policy_version > self.k:
                stale += 1
                if stale > 2 * self.window:  # every group out came back stale, twice over: it never ends
                    raise RunStopped(
                        f"step {step}: {stale} groups in a row came back more than sync.max_staleness={self.k} "
                        f"versions behind weights {version} (the last from version {group.min_policy_version}): the "
                        "engines do not get the learner's weights. Stopping rather than regenerating for ever"
                    )
            elif filtering and not keep_varied([group]):
                filtered += 1
            else:
                taken.append((slot, group))
                timings = timings.slowest(t)
            self._issue()
        self.counts["stale_dropped"] += stale
        self.counts["filtered_groups"] += filtered
        self.counts["trained_groups"] += len(taken)
        stats = {
            "rollout/groups_sampled": seen,
            "rollout/stale_dropped": stale,
            "rollout/filtered_groups": filtered,
            "rollout/in_flight_groups": len(self.in_flight),
            "rollout/buffered_groups": len(self.back),
            "rollout/regenerated_groups": self.counts["regenerated_groups"],
        }
        return [g for _, g in taken], timings, stats

    def settle(self) -> float:
        """Nothing to wait for before a push: weights land between two turns (`publish`)."""
        return 0.0

    def publish(self) -> None:
        """Send the sender's pending weights to every engine now; each loads them between two batched calls."""
        update = self.sender.take_pending()
        if update is None:
            return
        self.pool.latest = update  # what a restarted worker is given
        self.loads += [w.receive_weights.remote(update) for w in self.pool.workers]

    def evaluation(self, rows: list[dict[str, Any]], seed: int) -> list[TrajectoryGroup]:
        """The held-out rows on the newest weights (already published), beside the groups in flight."""
        groups, _ = self.pool.sample(
            rows, self.cfg.run.eval_samples, self.cfg.rollout.eval_temperature, seed, self.sender.take_pending()
        )
        return groups

    def state(self) -> dict[str, Any]:
        """What a checkpoint records: the slots consumed (what was in flight or back is generated again)."""
        return {"stream": {"base": self.base, "consumed_ahead": sorted(self.consumed_ahead)}}

    def restore(self, state: dict[str, Any]) -> None:
        saved = state.get("stream")
        if saved:
            self.base = self.next_slot = int(saved["base"])
            self.consumed_ahead = set(saved["consumed_ahead"])
            self.counts["trained_groups"] = self.base + len(self.consumed_ahead)  # drops before the kill: unknown

    # ------------------------------------------------------------------------- slots

    def _row(self, slot: int) -> dict[str, Any]:
        step, i = divmod(slot, self.per_step)
        if step not in self._rows:
            self._rows = {s: r for s, r in self._rows.items() if s >= self.base // self.per_step}
            self._rows[step] = self.sampler.for_step(step)
        return self._rows[step][i]

    def _issue(self) -> None:
        """Keep max(k, 1) * P slots beyond those consumed out or back; never past the schedule's end (the steps'
        slots plus as many as were dropped or filtered)."""
        consumed = self.base + len(self.consumed_ahead)
        dropped = consumed - self.counts["trained_groups"]
        end = min(consumed + self.window, self.cfg.run.steps * self.per_step + dropped)
        while self.next_slot < end:
            slot, self.next_slot = self.next_slot, self.next_slot + 1
            if slot not in self.consumed_ahead:
                self._send(slot)

    def _send(self, slot: int, redo: bool = False) -> None:
        """`redo`: the slot's call lost its work; environments it left open under the same keys are closed first."""
        r = self.cfg.rollout
        worker = min(range(len(self.load)), key=lambda i: (self.load[i], i))
        seed = self.cfg.run.seed * 100003 + 7919 * slot  # distinct per slot: the environments' keys include it
        row = self._row(slot)
        ref = self.pool.workers[worker].rollout.remote([row], r.group_size, r.temperature, seed, None, redo)
        self.in_flight[ref] = (slot, worker)
        self.load[worker] += 1

    def _consume(self, slot: int) -> None:
        self.consumed_ahead.add(slot)
        while self.base in self.consumed_ahead:
            self.consumed_ahead.remove(self.base)
            self.base += 1

    def _wait(self) -> None:
        """Wait for the next group back; a call that lost its work to a dead actor is issued again (after the
        restarted workers got the newest weights)."""
        deadlines = self.pool.recovery.deadlines if self.pool.recovery else None
        timeout = deadlines.rollout_s(self.cfg.rollout.group_size * max(self.load)) if deadlines else None
        done, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=timeout)
        if not done:
            raise ActorFailed(f"no rollout call came back in {timeout:.0f} s (a stuck engine or environment)")
        self._check_loads()
        for ref in done:
            slot, worker = self.in_flight.pop(ref)
            self.load[worker] -= 1
            try:
                groups, timings = ray.get(ref)
            except Exception as err:
                if not lost_to_an_actor(err) or self.pool.recovery is None:
                    raise
                log.warning("stream: slot %d lost its rollout to a dead actor; generating it again", slot)
                self.pool.recovery.recover()  # raises past the bound on restarts
                self._reload_restarted()
                self.counts["regenerated_groups"] += 1
                self._send(slot, redo=True)
                continue
            self.back[slot] = (groups[0], timings)

    def _check_loads(self) -> None:
        """Raise a failed weight load; forget the finished ones."""
        if not self.loads:
            return
        finished, self.loads = ray.wait(self.loads, num_returns=len(self.loads), timeout=0)
        for ref in finished:
            try:
                ray.get(ref)
            except Exception as err:
                if not lost_to_an_actor(err):
                    raise
                # The worker died (and restarts on the base model): `_reload_restarted` gives it the weights.

    def _reload_restarted(self) -> None:
        latest = self.pool.latest
        if latest is None:
            return
        versions = self.pool.versions()
        behind = [w for w, v in zip(self.pool.workers, versions) if v < latest.version]
        try:
            ray.get([w.receive_weights.remote(latest) for w in behind], timeout=600)
        except GetTimeoutError as err:
            raise ActorFailed("a restarted engine did not load the newest weights in 600 s") from err
