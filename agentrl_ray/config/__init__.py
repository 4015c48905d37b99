"""Typed configuration: the single source of truth for a run.

One dataclass per section, each with its own `check`, in the module of the role that reads it: `model.py` (model,
data), `rollout.py` (rollout, env, reward), `learner.py` (algorithm, echo, learner, lora), `run.py` (sync,
placement, recovery, run). Values are type-checked as they are built (`checking.py`); `validate` runs every
section's check, then the checks that span sections. Each component receives only its own sub-config.

A config is built in layers, later ones winning: dataclass defaults → the hardware profile's preset and the stability
preset → a YAML file → the Python API's values → dotted command-line overrides (`learner.lr=1e-6`). The presets
depend on the hardware the run will use, so the layering lives with the profiles (`infra.profiles.load_config`);
this package never looks at the machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from agentrl_ray.config.checking import ConfigError, build, need
from agentrl_ray.config.learner import AlgorithmConfig, EchoConfig, LearnerConfig, LoraConfig
from agentrl_ray.config.model import BUILTIN_MODELS, DataConfig, ModelConfig
from agentrl_ray.config.rollout import EnvConfig, RewardConfig, RolloutConfig
from agentrl_ray.config.run import PlacementConfig, RecoveryConfig, RunConfig, SyncConfig

__all__ = [
    "BUILTIN_MODELS",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EchoConfig",
    "EnvConfig",
    "LearnerConfig",
    "LoraConfig",
    "ModelConfig",
    "PlacementConfig",
    "RecoveryConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SyncConfig",
    "config_from_dict",
    "deep_merge",
    "load_yaml",
    "parse_overrides",
    "user_values",
    "validate",
]


@dataclass
class Config:
    """A whole run: one section per role."""

    profile: Literal["auto", "cpu", "lora", "gpu"] = "auto"
    """Hardware preset under the YAML and overrides; auto picks gpu when CUDA devices are visible, else cpu."""
    stability: Literal["conservative", "balanced", "aggressive"] = "balanced"
    """Preset of learning rate, clipping, KL and batch size, layered over the profile (config/stability.py)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engines and sampling."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Rewards."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Policy loss and data shaping."""
    echo: EchoConfig = field(default_factory=EchoConfig)
    """The ECHO loss on environment tokens."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The learner."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Weight sync."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Where each engine, env host and learner rank runs."""
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    """Restarts and deadlines."""
    run: RunConfig = field(default_factory=RunConfig)
    """The run."""

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir).expanduser().resolve() / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def validate(cfg: Config) -> None:
    """Every section's own checks, then the combinations across sections that cannot run: they fail here, before
    anything starts."""
    for section in (cfg.model, cfg.data, cfg.rollout, cfg.env, cfg.reward, cfg.algorithm, cfg.echo, cfg.learner):
        section.check()
    for section in (cfg.sync, cfg.placement, cfg.recovery, cfg.run):
        section.check()
    r, lr = cfg.rollout, cfg.learner
    need(
        r.lora_mode != "native" or lr.lora.enabled,
        "rollout.lora_mode=native applies a LoRA adapter in the engine: it needs learner.lora.enabled=true",
    )
    need(bool(cfg.reward.functions) or cfg.echo.only, "reward.functions is empty: nothing to train on")
    need(cfg.profile != "gpu" or lr.use_gpu, "profile=gpu needs learner.use_gpu=true (the gpu profile trains on GPUs)")
    need(
        not (lr.lora.enabled and cfg.sync.transport == "collective"),
        "sync.transport=collective ships full tensors; with learner.lora.enabled use sync.transport=object_store "
        "(adapter-only payload)",
    )
    if cfg.sync.pipeline == "stream":
        need(
            cfg.sync.transport == "object_store",
            f"sync.pipeline=stream hands each engine its weights while it generates: it needs "
            f"sync.transport=object_store, not {cfg.sync.transport} (profile=gpu picks collective: override it)",
        )
        need(
            cfg.placement.mode != "colocated" and r.sleep_mode != "always",
            "sync.pipeline=stream keeps the engines generating while the learner trains: it needs them apart "
            "(placement.mode=separate or auto, rollout.sleep_mode=auto or never)",
        )
        need(not cfg.env.agent, "env.agent (agent programs) runs on sync.pipeline=batch, not stream")
    need(
        r.prompts_per_step * r.group_size >= lr.num_workers,
        f"rollout.prompts_per_step * rollout.group_size ({r.prompts_per_step * r.group_size}) must be at least "
        f"learner.num_workers ({lr.num_workers}): every learner rank needs samples",
    )


def config_from_dict(data: dict[str, Any]) -> Config:
    """A config from a nested dict (a run's config.json, the layered values of `load_config`), validated."""
    cfg = build(Config, data)
    validate(cfg)
    return cfg


# ----------------------------------------------------------------------------------------------------------------
# The user's layers as nested dicts


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["learner.lr=1e-6", "rollout.group_size=8"]` → nested dict; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def user_values(
    path: str | Path | None = None, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The user's layers merged, later ones winning: the YAML file, the Python API's nested `values`, the dotted
    command-line overrides. The presets go under them (`infra.profiles.load_config`)."""
    user = load_yaml(path) if path is not None else {}
    return deep_merge(deep_merge(user, values or {}), parse_overrides(overrides or []))


def __getattr__(name: str) -> Any:
    if name == "load_config":
        raise ImportError(
            "agentrl_ray.config.load_config moved to agentrl_ray.infra.profiles.load_config (the presets under the "
            "user's values depend on the hardware; this package never looks at the machine)"
        )
    raise AttributeError(f"module 'agentrl_ray.config' has no attribute {name!r}")
