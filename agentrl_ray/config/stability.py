"""Stability presets: how hard each step pushes, beside the hardware profiles.

Layers, later ones winning: dataclass defaults → hardware profile (`infra/profiles.py`) → stability preset → YAML file →
dotted overrides. A preset scales the learning rate the profile chose (LoRA's is 10x a full fine-tune's), so
"conservative" means the same thing on every profile; any key the user sets in YAML or on the command line wins.

- balanced (default): the defaults as they are.
- conservative: a third of the learning rate with warm-up and cosine decay, tighter gradient clipping and trust
  region (epsilon 0.1), a small KL to the reference (beta 0.01), twice the prompts per step (less noisy gradients).
  For a new task, a large model or a run that went unhealthy.
- aggressive: three times the learning rate, constant, looser clipping, DAPO's clip-higher (0.28), no KL. For a
  small model on an easy task, when the budget is tight.
"""

from __future__ import annotations

from typing import Any

STABILITY = ("conservative", "balanced", "aggressive")
_DEFAULT_LR = 1e-4  # LearnerConfig.lr
_DEFAULT_PROMPTS = 16  # RolloutConfig.prompts_per_step


def stability_preset(name: str, profile_preset: dict[str, Any]) -> dict[str, Any]:
    """Nested config values of preset `name`, relative to the profile's own preset."""
    if name not in STABILITY:
        raise ValueError(f"unknown stability preset {name!r}: use one of {', '.join(STABILITY)}")
    lr = profile_preset.get("learner", {}).get("lr", _DEFAULT_LR)
    prompts = profile_preset.get("rollout", {}).get("prompts_per_step", _DEFAULT_PROMPTS)
    if name == "conservative":
        return {
            "learner": {
                "lr": lr / 3,
                "lr_schedule": "cosine",
                "min_lr_ratio": 0.1,
                "warmup_steps": 5,
                "max_grad_norm": 0.5,
            },
            "algorithm": {"epsilon": 0.1, "epsilon_high": 0.1, "beta": 0.01},
            "rollout": {"prompts_per_step": prompts * 2},
        }
    if name == "aggressive":
        return {
            "learner": {"lr": lr * 3, "lr_schedule": "constant", "max_grad_norm": 2.0},
            "algorithm": {"epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0},
        }
    return {}
