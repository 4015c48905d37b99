"""Typed configuration: the single source of truth for a run.

A config is built in layers, later ones winning: dataclass defaults → the profile preset
(`profiles.py`) → a YAML file → dotted command-line overrides (`learner.lr=1e-6`). Unknown keys, wrong
types and impossible combinations fail here, at parse time, with the dotted name of the offending key.
Each component receives only its own sub-config.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

BUILTIN_MODELS = ("tiny", "small")  # the sizes of builtin_model.RECIPES


class ConfigError(ValueError):
    """A config that cannot run: the message names the key and the problem."""


@dataclass
class ModelConfig:
    # "builtin:tiny" builds (once, then cached) the project's own small Qwen2-architecture chat model (0.44M
    # parameters); "builtin:small" its ~25M-parameter variant for benchmarks. Anything else is a local Hugging Face
    # model folder.
    path: str = "builtin:tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


@dataclass
class DataConfig:
    # "builtin:arithmetic" generates the default task; otherwise a .jsonl file, a `datasets.save_to_disk`
    # folder, or a folder of parquet/json files loadable by `datasets.load_dataset`.
    train: str = "builtin:arithmetic"
    eval: str = "builtin:arithmetic"
    train_size: int = 4000
    eval_size: int = 200
    prompt_column: str = "prompt"
    seed: int = 0


@dataclass
class RolloutConfig:
    num_workers: int = 1
    group_size: int = 8
    prompts_per_step: int = 16
    max_turns: int = 3
    max_tokens_per_turn: int = 48
    max_total_tokens: int = 320
    temperature: float = 1.0
    top_p: float = 1.0
    # Held-out success is measured by sampling at this temperature (pass@1 of the policy as it is trained).
    eval_temperature: float = 1.0
    kv_cache_gib: float = 1.0
    max_num_seqs: int = 256
    num_cpus_per_worker: float = 0.5
    num_gpus_per_worker: float = 0.0
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    # CPU threads of each engine; 0 = the node's cores shared among the engines (on-policy, rollout and learning
    # alternate, so each phase may use the whole node; with sync.max_staleness=1 the engines share half of it,
    # see profiles.default_threads).
    num_threads: int = 0


@dataclass
class EnvConfig:
    # Import path "package.module:Class"; the class is the TRL-style environment (tools are its methods).
    name: str = "agentrl_ray.envs.calculator:CalculatorEnv"
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_actors: int = 1
    num_cpus_per_actor: float = 0.25
    tool_timeout_s: float = 10.0


@dataclass
class RewardConfig:
    # Built-in names (see `agentrl_ray.rewards`) or import paths "package.module:function".
    functions: list[str] = field(default_factory=lambda: ["answer_match"])
    weights: list[float] = field(default_factory=lambda: [1.0])
    answer_column: str = "answer"


@dataclass
class AlgorithmConfig:
    # Advantages: baseline "mean" (GRPO) or "rloo" (leave-one-out); scale by the group std, the batch std, or not
    # at all ("none", Dr. GRPO).
    baseline: Literal["mean", "rloo"] = "mean"
    advantage_scale: Literal["group", "batch", "none"] = "group"
    # Policy loss: clipped ratio (PPO/GRPO), clip-higher (DAPO) through epsilon_high.
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    importance_sampling_level: Literal["token", "sequence"] = "token"
    num_iterations: int = 1
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        "token_mean"
    )
    # Constant for seq_mean_token_sum_norm; 0 means rollout.max_total_tokens.
    loss_norm_constant: int = 0
    # KL to the reference policy.
    beta: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    # Truncated importance sampling on the learner/rollout mismatch: cap of learner/rollout ratio (0 = off).
    tis_cap: float = 0.0
    # Data shaping.
    dynamic_sampling: Literal["off", "drop", "resample"] = "off"
    max_resample_rounds: int = 3
    mask_truncated: bool = False
    overlong_penalty_tokens: int = 0
    overlong_penalty_factor: float = 1.0


@dataclass
class EchoConfig:
    coeff: float = 0.0
    schedule: Literal["constant", "linear", "step"] = "constant"
    final_coeff: float = 0.0
    decay_steps: int = 0
    normalization: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    only: bool = False


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class LearnerConfig:
    backend: Literal["ddp", "deepspeed"] = "ddp"
    zero_stage: int = 2
    num_workers: int = 1
    use_gpu: bool = False
    num_cpus_per_worker: float = 1.0
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 32
    torch_threads: int = 0  # 0 = every core of the node, shared by its learner workers (profiles.default_threads)
    # Mixed precision for the DDP learner (CPU or GPU): bfloat16 autocast, float32 weights and optimizer (like
    # TRL's bf16=True). ~2.6x faster on a 25M model on an AMX CPU (docs/benchmarks.md). DeepSpeed uses its own.
    bf16: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class SyncConfig:
    transport: Literal["object_store", "collective"] = "object_store"
    # 0: on-policy, every step samples with the newest weights. 1: step t+1's rollout runs while the learner trains
    # on step t (one version behind; the PPO ratio against the sampling logprobs corrects for it).
    max_staleness: int = 0
    # Collective transport: tensors travel in buckets of at most this many MiB (the extra memory on either end).
    bucket_mb: int = 256


@dataclass
class RunConfig:
    name: str = "calculator"
    output_dir: str = "runs"
    steps: int = 30
    seed: int = 0
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    resume: bool = False
    eval_every: int = 10
    eval_at_start: bool = True
    eval_samples: int = 2  # samples per held-out prompt
    success_threshold: float = 1.0  # a trajectory succeeds when its reward reaches this
    wandb: bool = False
    wandb_mode: Literal["online", "offline"] = "offline"
    wandb_project: str = "agentrl_ray"
    plot: bool = True


@dataclass
class Config:
    profile: Literal["auto", "cpu", "lora", "gpu"] = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    echo: EchoConfig = field(default_factory=EchoConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir).expanduser().resolve() / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------------------------
# Building from nested dicts


def _check_value(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"{where}: {value!r} is not one of {choices}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)[:1]
        return [_check_value(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        return value
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported config type {tp!r}")


def _build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown config key(s): {', '.join(prefix + k for k in unknown)} "
            f"(valid keys under {where or 'the top level'}: {', '.join(sorted(names))})"
        )
    kwargs = {k: _check_value(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """YAML file + dotted overrides → validated Config, with the profile preset applied underneath."""
    from agentrl_ray.profiles import profile_preset, resolve_profile

    user = load_yaml(path) if path is not None else {}
    user = deep_merge(user, parse_overrides(overrides or []))
    requested = user.get("profile", "auto")
    _check_value(requested, typing.get_type_hints(Config)["profile"], "profile")
    profile = resolve_profile(requested)
    merged = deep_merge(profile_preset(profile), {**user, "profile": profile})
    cfg = _build(Config, merged)
    validate(cfg)
    # Relative to where the command runs: Ray Train workers run in another working directory.
    cfg.run.output_dir = str(Path(cfg.run.output_dir).expanduser().resolve())
    return cfg


def validate(cfg: Config) -> None:
    """Cross-field checks: combinations that cannot run fail here, before anything starts."""
    r, a, e, lr, s = cfg.rollout, cfg.algorithm, cfg.echo, cfg.learner, cfg.sync

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    if cfg.model.path.startswith("builtin:"):
        need(
            cfg.model.path.removeprefix("builtin:") in BUILTIN_MODELS,
            f"model.path {cfg.model.path!r}: the built-in models are "
            + ", ".join(f"builtin:{m}" for m in BUILTIN_MODELS),
        )
    need(r.num_workers >= 1, "rollout.num_workers must be at least 1")
    need(r.group_size >= 2, "rollout.group_size must be at least 2: GRPO normalizes rewards within a group")
    need(r.prompts_per_step >= 1, "rollout.prompts_per_step must be at least 1")
    need(r.max_turns >= 1, "rollout.max_turns must be at least 1")
    need(r.max_tokens_per_turn >= 1, "rollout.max_tokens_per_turn must be at least 1")
    need(
        r.max_total_tokens > r.max_tokens_per_turn,
        f"rollout.max_total_tokens ({r.max_total_tokens}) must exceed rollout.max_tokens_per_turn "
        f"({r.max_tokens_per_turn}): the prompt has to fit too",
    )
    need(r.temperature > 0, "rollout.temperature must be > 0 for training rollouts")
    need(r.eval_temperature >= 0, "rollout.eval_temperature must be >= 0 (0 = greedy)")
    need(0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]")
    need(r.kv_cache_gib > 0, "rollout.kv_cache_gib must be > 0")
    need(cfg.env.num_actors >= 1, "env.num_actors must be at least 1")
    need(cfg.env.tool_timeout_s > 0, "env.tool_timeout_s must be > 0")
    need(":" in cfg.env.name, f"env.name {cfg.env.name!r} must be an import path 'package.module:Class'")
    need(
        len(cfg.reward.functions) == len(cfg.reward.weights),
        f"reward.functions has {len(cfg.reward.functions)} entries but reward.weights has "
        f"{len(cfg.reward.weights)}: give one weight per function",
    )
    need(bool(cfg.reward.functions) or e.only, "reward.functions is empty: nothing to train on")
    need(0 <= a.epsilon < 1 and 0 <= a.epsilon_high, "algorithm.epsilon must be in [0, 1), epsilon_high >= 0")
    need(a.num_iterations >= 1, "algorithm.num_iterations must be at least 1")
    need(a.beta >= 0, "algorithm.beta must be >= 0")
    need(a.tis_cap == 0 or a.tis_cap >= 1, "algorithm.tis_cap must be 0 (off) or >= 1")
    need(e.coeff >= 0 and e.final_coeff >= 0, "echo.coeff and echo.final_coeff must be >= 0")
    need(not e.only or e.coeff > 0, "echo.only=true needs echo.coeff > 0")
    need(
        e.schedule == "constant" or e.decay_steps > 0,
        "echo.schedule linear/step needs echo.decay_steps > 0",
    )
    need(lr.num_workers >= 1, "learner.num_workers must be at least 1")
    need(lr.lr > 0, "learner.lr must be > 0")
    need(len(lr.betas) == 2, "learner.betas must hold two numbers")
    need(lr.micro_batch_size >= 1, "learner.micro_batch_size must be at least 1")
    need(lr.zero_stage in (0, 1, 2, 3), "learner.zero_stage must be 0, 1, 2 or 3")
    need(
        not (lr.lora.enabled and lr.backend == "deepspeed" and lr.zero_stage == 3),
        "learner.lora with DeepSpeed ZeRO-3 is not supported: use zero_stage<=2",
    )
    need(
        cfg.profile != "gpu" or lr.use_gpu,
        "profile=gpu needs learner.use_gpu=true (the gpu profile trains on GPUs)",
    )
    need(
        s.max_staleness in (0, 1),
        "sync.max_staleness must be 0 (on-policy) or 1 (roll out step t+1 while training on step t)",
    )
    need(
        not (lr.lora.enabled and s.transport == "collective"),
        "sync.transport=collective ships full tensors; with learner.lora.enabled use sync.transport=object_store "
        "(adapter-only payload)",
    )
    need(s.bucket_mb >= 1, "sync.bucket_mb must be at least 1")
    need(cfg.run.steps >= 1, "run.steps must be at least 1")
    need(cfg.run.checkpoint_every >= 0, "run.checkpoint_every must be >= 0 (0 = only at the end)")
    need(cfg.run.eval_every >= 0, "run.eval_every must be >= 0 (0 = only at the end)")
    need(cfg.data.eval_size >= 1, "data.eval_size must be at least 1")
    need(cfg.run.eval_samples >= 1, "run.eval_samples must be at least 1")
    need(
        r.prompts_per_step * r.group_size >= lr.num_workers,
        f"rollout.prompts_per_step * rollout.group_size ({r.prompts_per_step * r.group_size}) must be at least "
        f"learner.num_workers ({lr.num_workers}): every learner rank needs samples",
    )
    need(bool(cfg.run.name) and "/" not in cfg.run.name, "run.name must be a non-empty name without '/'")
