"""Run health: a verdict per step (ok / warn / red, with reasons) from the step's metrics, and early stopping.

Each check is a pure function of the step's metrics and what came before (`History`); `HealthMonitor` keeps that
history and combines the checks. The verdict goes to the console line and to metrics.jsonl (`health/level`: 0 ok,
1 warn, 2 red; `health/reasons`). What is watched, and why it matters for GRPO:

- no learning signal: every group's rewards equal (all groups zero-variance): the advantages are all 0;
- reward variance collapsing: the mean within-group reward std falls far below its running peak (not while success
  is high and steady: groups that all succeed have no variance left);
- entropy collapse (the policy turns deterministic, exploration ends) or blow-up (it turns to noise). A policy that
  sharpens onto a high, steady success has converged, not collapsed: falling entropy counts only while the training
  success (`rollout/success`) is low or falling (the default run ends at entropy 0.02x its start with held-out
  success 0.92, steady);
- KL blowing up: `loss/kl` to the reference, or the learner/rollout KL `loss/mismatch_kl` (overlapped, it measures
  how far the last update moved the policy: a too-large step shows here before the reward falls);
- clip fraction blowing up: most tokens' ratios are outside the trust region;
- gradient-norm spikes against the running median of the previous steps;
- tool-error rate: most tool calls fail (malformed calls, or a broken environment);
- NaN or inf in a loss metric;
- an integrity check that failed (`integrity/failed`, `learner/integrity.py`): named in the reasons.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

OK, WARN, RED = 0, 1, 2
LEVEL_NAMES = ("ok", "warn", "red")


@dataclass
class Thresholds:
    zero_variance_red_steps: int = 3  # consecutive all-zero-variance steps that make a red verdict
    reward_std_collapse: float = 0.2  # warn below this fraction of the running peak group std
    entropy_low: tuple[float, float] = (0.1, 0.02)  # (warn, red) fractions of the baseline entropy (a learning
    # policy sharpens: on the calculator task entropy fell to ~0.13x its start while held-out success rose 0.2 -> 0.8)
    entropy_high: tuple[float, float] = (2.0, 4.0)  # (warn, red) multiples of the baseline entropy
    kl: tuple[float, float] = (0.05, 0.5)
    clip_frac: tuple[float, float] = (0.2, 0.5)
    grad_spike: tuple[float, float] = (5.0, 20.0)  # multiples of the running median grad norm
    tool_error_rate: tuple[float, float] = (0.5, 0.9)
    baseline_steps: int = 3  # steps whose median entropy is the baseline
    # Converged: the mean training success of the last `converged_window` steps is at least `converged_success` and
    # within `converged_drop` of the best such mean so far. Then low entropy is no finding.
    converged_success: float = 0.7
    converged_window: int = 5
    converged_drop: float = 0.1
    window: int = 20  # steps of grad-norm history


@dataclass
class History:
    grad_norms: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    peak_group_std: float = 0.0
    zero_variance_streak: int = 0
    successes: list[float] = field(default_factory=list)  # the last `converged_window` steps' rollout/success
    best_success: float = 0.0  # the best mean of `successes` so far


Finding = tuple[int, str]  # (level, reason)


def check_nan(m: dict[str, Any]) -> list[Finding]:
    bad = [k for k, v in m.items() if k.startswith("loss/") and isinstance(v, float) and not math.isfinite(v)]
    return [(RED, f"non-finite {', '.join(sorted(bad))}")] if bad else []


def check_signal(m: dict[str, Any], h: History, t: Thresholds, held: bool = False) -> list[Finding]:
    """No signal (every group's rewards equal), and a group std far below its peak unless success is `held` high and
    steady: groups that all succeed have no variance left, which is convergence, not a collapse."""
    zero = m.get("rollout/zero_variance_groups")
    if zero is None:
        return []
    h.zero_variance_streak = h.zero_variance_streak + 1 if zero >= 1.0 else 0
    if h.zero_variance_streak >= t.zero_variance_red_steps:
        return [(RED, f"all groups zero-variance for {h.zero_variance_streak} steps: no learning signal")]
    if h.zero_variance_streak:
        return [(WARN, "all groups zero-variance: no learning signal this step")]
    std = m.get("reward/group_std")
    findings = []
    if std is not None:
        if h.peak_group_std > 0 and std < t.reward_std_collapse * h.peak_group_std and not held:
            findings.append((WARN, f"reward variance collapsing: group std {std:.3f} vs peak {h.peak_group_std:.3f}"))
        h.peak_group_std = max(h.peak_group_std, std)
    return findings


def success_held(m: dict[str, Any], h: History, t: Thresholds) -> tuple[bool, float | None]:
    """(is the training success high and steady, its mean over the last `t.converged_window` steps or None before
    that many steps). Steady: within `t.converged_drop` of the best such mean so far, so a falling success is not."""
    success = m.get("rollout/success")
    if success is None or not math.isfinite(success):
        return False, None
    h.successes = (h.successes + [success])[-t.converged_window :]
    if len(h.successes) < t.converged_window:
        return False, None
    recent = statistics.fmean(h.successes)
    h.best_success = max(h.best_success, recent)
    return recent >= t.converged_success and recent >= h.best_success - t.converged_drop, recent


def check_entropy(m: dict[str, Any], h: History, t: Thresholds, held: bool, recent: float | None) -> list[Finding]:
    entropy = m.get("loss/entropy")
    if entropy is None or not math.isfinite(entropy):
        return []
    baseline = statistics.median(h.entropies) if len(h.entropies) >= t.baseline_steps else None
    if len(h.entropies) < t.baseline_steps:
        h.entropies.append(entropy)
    if not baseline:
        return []
    ratio = entropy / baseline
    if ratio < 1 and held:  # sharpened onto a high, steady success: convergence
        return []
    context = (
        f"; success {recent:.2f} over the last {t.converged_window} steps" if ratio < 1 and recent is not None else ""
    )
    if ratio < t.entropy_low[1] or ratio > t.entropy_high[1]:
        kind = "collapse" if ratio < 1 else "blow-up"
        return [(RED, f"entropy {entropy:.3f} vs baseline {baseline:.3f} ({kind}{context})")]
    if ratio < t.entropy_low[0] or ratio > t.entropy_high[0]:
        kind = "falling" if ratio < 1 else "rising"
        return [(WARN, f"entropy {entropy:.3f} vs baseline {baseline:.3f} ({kind}{context})")]
    return []


def _over(value: float | None, limits: tuple[float, float], what: str) -> list[Finding]:
    if value is None or not math.isfinite(value):
        return []
    if value > limits[1]:
        return [(RED, f"{what} {value:.3g} > {limits[1]:g}")]
    if value > limits[0]:
        return [(WARN, f"{what} {value:.3g} > {limits[0]:g}")]
    return []


def check_trust_region(m: dict[str, Any], t: Thresholds) -> list[Finding]:
    kl = max(m.get("loss/kl", 0.0), m.get("loss/mismatch_kl", 0.0))
    clip = m.get("loss/clip_frac_low", 0.0) + m.get("loss/clip_frac_high", 0.0)
    return _over(kl, t.kl, "KL") + _over(clip, t.clip_frac, "clip fraction")


def check_grad_norm(m: dict[str, Any], h: History, t: Thresholds) -> list[Finding]:
    norm = m.get("loss/grad_norm")
    if norm is None or not math.isfinite(norm):
        return []
    findings: list[Finding] = []
    if len(h.grad_norms) >= 3:
        median = statistics.median(h.grad_norms)
        if median > 0:
            findings = _over(norm / median, t.grad_spike, f"grad norm {norm:.3g} / running median {median:.3g} =")
    h.grad_norms = (h.grad_norms + [norm])[-t.window :]
    return findings


def check_tools(m: dict[str, Any], t: Thresholds) -> list[Finding]:
    if m.get("rollout/tool_calls_per_traj", 0.0) <= 0:
        return []
    return _over(m.get("rollout/tool_error_rate"), t.tool_error_rate, "tool-error rate")


def check_integrity(m: dict[str, Any]) -> list[Finding]:
    failed = m.get("integrity/failed")
    return [(WARN, f"integrity {failed}")] if failed else []


@dataclass
class Verdict:
    level: int
    reasons: list[str]

    @property
    def name(self) -> str:
        return LEVEL_NAMES[self.level]

    def metrics(self) -> dict[str, Any]:
        return {"health/level": self.level, "health/reasons": "; ".join(self.reasons)}


class HealthMonitor:
    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.t = thresholds or Thresholds()
        self.h = History()

    def update(self, m: dict[str, Any]) -> Verdict:
        held, recent = success_held(m, self.h, self.t)  # every step, so the window is whole when it matters
        findings = (
            check_nan(m)
            + check_signal(m, self.h, self.t, held)
            + check_entropy(m, self.h, self.t, held, recent)
            + check_trust_region(m, self.t)
            + check_grad_norm(m, self.h, self.t)
            + check_tools(m, self.t)
            + check_integrity(m)
        )
        level = max((lvl for lvl, _ in findings), default=OK)
        return Verdict(level, [reason for lvl, reason in sorted(findings, key=lambda f: -f[0])])


class EarlyStopper:
    """Stop when `metric` has not improved by more than `min_delta` over its best for `patience` evaluations."""

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0, mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"early stopping mode must be 'max' or 'min', got {mode!r}")
        self.metric, self.patience, self.min_delta, self.mode = metric, patience, min_delta, mode
        self.best: float | None = None
        self.best_step = 0
        self.stale = 0

    def update(self, step: int, m: dict[str, Any]) -> str | None:
        """The reason to stop after this step, or None. Steps without the metric (no evaluation) do not count."""
        value = m.get(self.metric)
        if self.patience <= 0 or value is None:
            return None
        sign = 1.0 if self.mode == "max" else -1.0
        if self.best is None or sign * (value - self.best) > self.min_delta:
            self.best, self.best_step, self.stale = value, step, 0
            return None
        self.stale += 1
        if self.stale >= self.patience:
            return (
                f"{self.metric} has not improved by more than {self.min_delta:g} for {self.stale} evaluations "
                f"(best {self.best:.4f} at step {self.best_step}, now {value:.4f} at step {step})"
            )
        return None
