"""Checkpoints through Ray Train: save every rank's part with the trainer state, restore the latest (or a folder
verified by `run.resume`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from agentrl_ray.learner.policy import TRAINER_STATE, Policy


def save_checkpoint(policy: Policy, tokenizer, state: dict[str, Any], rank: int, metrics: dict[str, Any]) -> None:
    import ray.train

    with tempfile.TemporaryDirectory() as tmp:
        policy.save(Path(tmp), {**state, "rank": rank}, tokenizer)
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=f"checkpoint_{state['step']:06d}",
        )


def restore(policy: Policy, fallback: str | None = None) -> dict[str, Any] | None:
    """Load Ray Train's latest checkpoint, or `fallback` (a verified folder chosen by resume.prepare when Ray
    Train's snapshot was unusable; Ray Train v2 refuses `resume_from_checkpoint`)."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and fallback:
        checkpoint = ray.train.Checkpoint(fallback)
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as path:
        if not (Path(path) / TRAINER_STATE).exists():
            raise RuntimeError(f"checkpoint {path} has no {TRAINER_STATE}: it is incomplete")
        return policy.load(Path(path))
