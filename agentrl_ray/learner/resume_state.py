"""What a checkpoint carries besides weights and optimizer, so that a resumed run is the run that would have been.

- RNG states (Python, NumPy, torch; CUDA where present): everything random on the learner continues where it was.
- The batch already sampled for the next step. Overlapped (`sync.max_staleness=1`), step s's batch was sampled by
  version s-1 while step s-1 trained, and is back (`RolloutFeed.settle`) before the checkpoint of step s is written;
  re-sampling it after a resume would use version s's weights and give another run. It is saved and handed back.
  On-policy no batch is out at a checkpoint.
The prompts themselves need no state: `PromptSampler` is a pure function of (seed, step).

Everything is stored as tensors and plain Python values, so the trainer state loads with `weights_only=True`.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import torch

from agentrl_ray.types import RolloutTimings, Trajectory, TrajectoryGroup


def rng_state() -> dict[str, Any]:
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def batch_state(ready: dict[int, tuple[list[TrajectoryGroup], RolloutTimings]]) -> dict[int, dict[str, Any]]:
    """The feed's sampled-but-untrained batches (`RolloutFeed.ready`) as plain values."""
    return {
        step: {
            "groups": [
                {"prompt_id": g.prompt_id, "trajectories": [dataclasses.asdict(t) for t in g.trajectories]}
                for g in groups
            ],
            "timings": dataclasses.asdict(timings),
        }
        for step, (groups, timings) in ready.items()
    }


def batches_from_state(state: dict[int, dict[str, Any]]) -> dict[int, tuple[list[TrajectoryGroup], RolloutTimings]]:
    """`batch_state` read back: the same groups, validated again on construction."""
    return {
        int(step): (
            [TrajectoryGroup(g["prompt_id"], [Trajectory(**t) for t in g["trajectories"]]) for g in saved["groups"]],
            RolloutTimings(**saved["timings"]),
        )
        for step, saved in state.items()
    }
