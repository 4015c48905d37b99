"""Integrity checks, on every step (`run.integrity`, on by default): the silent failures of RL training, caught in
the step where they happen.

Four checks, each logged every step under `integrity/<check>/...`:
- `policy_version`: each trained trajectory's policy version (the version of its oldest token) is within
  `sync.max_staleness` of the learner's. A group holding one further behind is dropped before the update, never
  trained (`integrity/policy_version/dropped_groups`): a sync that did not reach a worker.
- `token_continuity`: every engine call of a trajectory (its prompt, its sampled ids and log-probs) sits intact in
  the trained sequence, and each turn's prompt extends the previous turn's prompt and sample (`rollout/continuity.py`,
  checked where each trajectory is assembled, for every backend and the agent endpoint's stitched sequences).
- `weights`: after each sync, a probe: a few of the run's own prompts, teacher-forced through every engine and
  through the learner on the weights just pushed; the mean |log-prob gap| must stay within the band of the engines'
  dtype (`BANDS`). A tensor the sync left out, an adapter the engine never applied or a half-done load shows here.
- `behaviour_logprobs`: on the trained action tokens that the learner's current weights sampled (the on-policy rows),
  the mean |engine log-prob - learner log-prob| stays within the same band (computed in `update.py` from the forward
  the loss runs anyway). Overlapped rows carry a policy step on top of the gap and are not judged.

A violation adds `integrity/failed` (one line per check that failed: which, where, by how much) to the step's
metrics; the health verdict warns with it (`health.py`), `stop.json` / summary.json count it, and with
`run.strict_integrity=true` the run stops at that step with that line. The cost (the probe's forwards, the
comparisons) is `time/integrity_s`, measured against the step by `benchmarks/run.py overhead --mode integrity_cost`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from agentrl_ray.types import TrajectoryGroup

log = logging.getLogger("agentrl_ray")

PROBE_PROMPTS = 2  # the first held-out (else training) rows of the run's task
PROBE_TOKENS = 48  # each probe is the last PROBE_TOKENS ids of its rendered prompt
PROBE_TIMEOUT_S = 300.0
# The mean |engine - learner| log-prob gap a healthy run stays under, by the engines' dtype and device (measured in
# docs/integrity.md). float32 on a CPU: the probe's gap is ~3e-6 with vLLM and ~3e-7 with the torch engine, and one
# tensor left out of a sync after one Adam step at the default run's lr (2e-4) opens it to 1.5e-4 (a bias) to 0.14 (a
# projection). bfloat16 rounds every weight and activation: the gap is ~0.05 with the right weights, so there the
# band catches a whole sync or adapter missing, not one small tensor. A GPU's float32 may run its matmuls in TF32.
# `run.integrity_band` overrides the table.
BANDS = {("float32", False): 5e-5, ("float32", True): 5e-3, ("float16", False): 0.1, ("float16", True): 0.1}
BANDS |= {("bfloat16", False): 0.15, ("bfloat16", True): 0.15}


def bands(cfg) -> tuple[float, float]:
    """(the weights probe's band, the behaviour check's): `run.integrity_band`, else the table's for the dtype each
    compares in on this device. The probe runs the learner without `learner.bf16`'s autocast, so it compares float32
    weights unless the engines or the learner hold bfloat16 ones (model.dtype, a LoRA base under learner.bf16,
    DeepSpeed's bf16); the trained tokens' log-probs come from the loss's forward, under the autocast."""
    lc, gpu = cfg.learner, torch.cuda.is_available()
    probe = "bfloat16" if lc.bf16 and (lc.lora.enabled or lc.backend == "deepspeed") else cfg.model.dtype
    behaviour = "bfloat16" if lc.bf16 else cfg.model.dtype
    return cfg.run.integrity_band or BANDS[(probe, gpu)], cfg.run.integrity_band or BANDS[(behaviour, gpu)]


def probe_sequences(tokenizer, rows: list[dict[str, Any]], system_prompt: str) -> list[list[int]]:
    """The probe: the last PROBE_TOKENS ids of each of the first PROBE_PROMPTS rows' rendered prompts."""
    from agentrl_ray.chat_format import prompt_messages

    out = []
    for row in rows[:PROBE_PROMPTS]:
        ids = tokenizer.apply_chat_template(
            prompt_messages(row["prompt"], system_prompt), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        out.append(list(ids)[-PROBE_TOKENS:])
    return out


def stale_groups(groups: list[TrajectoryGroup], version: int, max_staleness: int) -> tuple[list, dict, str]:
    """(the groups within the bound, the check's metrics, "" or the violation): `version` is the learner's."""
    lags = [version - g.min_policy_version for g in groups]
    stale = [g.prompt_id for g, lag in zip(groups, lags) if lag > max_staleness]
    metrics = {
        "integrity/policy_version/max_lag": max(lags, default=0),
        "integrity/policy_version/dropped_groups": len(stale),
    }
    if not stale:
        return groups, metrics, ""
    failure = (
        f"{len(stale)} group(s) ({', '.join(stale[:3])}) sampled {max(lags)} versions behind the learner's {version}, "
        f"over sync.max_staleness={max_staleness}: dropped, not trained (a weight sync did not reach every worker)"
    )
    return [g for g, lag in zip(groups, lags) if lag <= max_staleness], metrics, failure


def continuity(groups: list[TrajectoryGroup]) -> tuple[dict, str]:
    """The step's trajectories whose assembly broke a turn (`rollout/continuity.py`): metrics, "" or the violation."""
    broken = [
        (g.prompt_id, t.sample_index, t.continuity_break) for g in groups for t in g.trajectories if t.continuity_break
    ]
    metrics = {"integrity/token_continuity/broken": len(broken)}
    if not broken:
        return metrics, ""
    prompt, sample, where = broken[0]
    return (
        metrics,
        f"{len(broken)} trajectory(ies) do not hold their engine calls intact; first {prompt}/{sample}: {where}",
    )


def probe_gap(engines: list[list[list[float]]], learner: list[list[float]]) -> tuple[float, float, int]:
    """(the largest mean |gap| over the engines, the largest single |gap|, the engine with that mean) between each
    engine's probe log-probs and the learner's."""
    means, largest = [], 0.0
    for scored in engines:
        diffs = [_gap(a, b) for seq, ref in zip(scored, learner, strict=True) for a, b in zip(seq, ref, strict=True)]
        means.append(sum(diffs) / max(1, len(diffs)))
        largest = max(largest, *diffs)
    mean = max(means)
    return mean, largest, means.index(mean)


def _gap(a: float, b: float) -> float:
    """|a - b| of two log-probs; the same -inf twice is no gap, and a NaN one (a broken engine's) an infinite gap,
    which fails the check and keeps the metric comparable (a NaN mean compares false with everything)."""
    if a == b:
        return 0.0
    gap = abs(a - b)
    return gap if gap == gap else math.inf


@torch.no_grad()
def behaviour_gap(acc: list, learner: torch.Tensor, batch, version: int) -> None:
    """Add a micro-batch's |engine - learner| log-prob gaps on the action tokens of its rows sampled by `version`
    (the learner's weights) to `acc` = [sum, tokens, max]. `learner`: (b, t) log-probs, token t's at t."""
    rows = (batch.policy_version == version).to(batch.action_mask.device)  # (b,)
    mask = (batch.action_mask > 0) & rows[:, None]  # (b, t)
    diffs = (learner.float() - batch.rollout_logprobs.float()).abs()[mask]  # (n,)
    if diffs.numel():
        acc[0] += float(diffs.sum())
        acc[1] += diffs.numel()
        acc[2] = max(acc[2], float(diffs.max()))


def gap_failure(gap: float | None, limit: float, where: str) -> str:
    if gap is None or gap <= limit:
        return ""
    return f"mean |log-prob gap| {gap:.3g} over the {limit:g} band {where}"


class Integrity:
    """Every rank holds one (the probe's forward runs on every rank, as a ZeRO-3 forward must); rank 0 asks the
    engines, compares and reports."""

    def __init__(self, cfg, tokenizer, rows: list[dict[str, Any]], rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.on = cfg.run.integrity
        self.band, self.behaviour_band = bands(cfg)
        self.sequences = probe_sequences(tokenizer, rows, cfg.rollout.system_prompt) if self.on else []
        self.failed_steps = 0
        self.first_failure: str | None = None
        self.weights_failure = ""  # the last probe's violation, reported with its step
        self.version_failure, self.version_metrics = "", {}  # the step's policy-version check (`admit`)
        self.pending: tuple[int, list, list] | None = None  # the probe in flight: (version, engine calls, learner's)

    def admit(self, groups: list[TrajectoryGroup], version: int) -> list[TrajectoryGroup]:
        """Rank 0, before the update: the step's groups within sync.max_staleness of the learner's `version`."""
        if not self.on:
            return groups
        groups, self.version_metrics, self.version_failure = stale_groups(groups, version, self.cfg.sync.max_staleness)
        return groups

    # ---------------------------------------------------------------- after the update and the sync

    def probe(self, policy, pool, sender, version: int, last: bool) -> dict[str, Any]:
        """After the sync of weights `version`: every rank computes the learner's probe log-probs on them; rank 0
        hands the probe to the engines (with the pushed weights where they wait for the next call) and returns the
        metrics of the previous probe, whose engine calls ran meanwhile. The engines answer a probe before the next
        rollout (an actor's calls run in order), so its result is read one step later at no wait; on the `last` step
        it is read at once."""
        if not self.on:
            return {}
        t0 = time.perf_counter()
        out = self._collect() if self.rank == 0 else {}
        mine = self._learner_logprobs(policy)
        if self.rank == 0:
            self.pending = (version, pool.probe(self.sequences, sender.take_pending()), mine)
            if last:  # both probes in one record: the worse of each gap
                now = self._collect()
                out = {k: max(v, out[k]) if k.endswith("_gap") and k in out else v for k, v in {**out, **now}.items()}
        out["time/integrity_s"] = out.get("time/integrity_s", 0.0) + time.perf_counter() - t0
        return out

    def _collect(self) -> dict[str, Any]:
        """The pending probe's metrics (rank 0): the engines' log-probs against the learner's on the same weights."""
        if self.pending is None:
            return {}
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        version, calls, mine = self.pending
        self.pending = None
        try:
            engines = ray.get(calls, timeout=PROBE_TIMEOUT_S)
        except (RayError, GetTimeoutError) as err:  # a dead engine: recovery redoes its next rollout
            log.warning("integrity probe of weights %d skipped: %s", version, str(err).splitlines()[0])
            return {"integrity/weights/skipped": 1}
        mean, largest, engine = probe_gap(engines, mine)
        failure = gap_failure(mean, self.band, f"on engine {engine} after the sync of weights {version}")
        if failure:
            failure += ": the engine does not hold the learner's weights"
            self.weights_failure = f"{self.weights_failure}; {failure}" if self.weights_failure else failure
        return {
            "integrity/weights/version": version,
            "integrity/weights/mean_gap": mean,
            "integrity/weights/max_gap": largest,
            "integrity/weights/band": self.band,
        }

    @torch.no_grad()
    def _learner_logprobs(self, policy) -> list[list[float]]:
        width = max(map(len, self.sequences))
        ids = torch.zeros(len(self.sequences), width, dtype=torch.long)  # (B, width), right-padded
        mask = torch.zeros_like(ids)
        for row, s in enumerate(self.sequences):
            ids[row, : len(s)] = torch.tensor(s)
            mask[row, : len(s)] = 1
        ids, mask = ids.to(policy.device), mask.to(policy.device)
        logprobs, _ = policy.token_logprobs(ids, mask, False, needed=mask > 0, exact=True)  # (B, width): t's at t
        logprobs = logprobs.float().cpu()
        return [logprobs[row, 1 : len(s)].tolist() for row, s in enumerate(self.sequences)]

    # ---------------------------------------------------------------- the step's report (rank 0)

    def report(self, step: int, groups: list[TrajectoryGroup], metrics: dict[str, Any]) -> str:
        """Rank 0: add the step's checks to `metrics` (`integrity/failed`: one line per check that failed) and return
        the first violation ("" when none). `metrics` holds the probe's and the update's parts already."""
        if not self.on:
            return ""
        t0 = time.perf_counter()
        cont, broken = continuity(groups)
        metrics.update(cont, **self.version_metrics)
        behaviour = gap_failure(
            metrics.get("integrity/behaviour_logprobs/mean_gap"),
            self.behaviour_band,
            f"on the step's on-policy action tokens ({self.cfg.rollout.backend} engines)",
        )
        if "integrity/behaviour_logprobs/mean_gap" in metrics:
            metrics["integrity/behaviour_logprobs/band"] = self.behaviour_band
        found = {
            "policy_version": self.version_failure,
            "token_continuity": broken,
            "weights": self.weights_failure,
            "behaviour_logprobs": behaviour,
        }
        self.weights_failure = self.version_failure = ""
        failures = [f"{check}: {what}" for check, what in found.items() if what]
        metrics["integrity/failures"] = len(failures)
        metrics["time/integrity_s"] = metrics.get("time/integrity_s", 0.0) + time.perf_counter() - t0
        if not failures:
            return ""
        metrics["integrity/failed"] = "; ".join(failures)
        self.failed_steps += 1
        if self.first_failure is None:
            self.first_failure = f"step {step}: {failures[0]}"
        return failures[0]

    def summary(self) -> dict[str, Any]:
        return {"integrity_failed_steps": self.failed_steps, "first_integrity_failure": self.first_failure}
