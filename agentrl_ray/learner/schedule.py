"""Learning-rate schedules: pure functions of the step, so a resumed run continues on the same curve.

`learner.lr_schedule`:
- constant: the peak lr after warm-up;
- linear:   linear decay from the peak to `min_lr_ratio * lr` at the last step;
- cosine:   half-cosine decay from the peak to `min_lr_ratio * lr` at the last step.
Warm-up (`learner.warmup_steps`) ramps linearly from lr / warmup_steps to the peak over the first steps, and the
decay runs over the steps after it.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_at(step: int, lr: float, schedule: str, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total_steps`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)  # 0 right after warm-up, 1 at the last step
    floor = lr * min_lr_ratio
    if schedule == "linear":
        return floor + (lr - floor) * (1.0 - progress)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
