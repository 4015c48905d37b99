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

from agentrl_ray.profiles import profile_preset, resolve_profile
from agentrl_ray.stability import STABILITY, stability_preset

BUILTIN_MODELS = ("tiny", "small", "tiny-grid")  # the sizes of builtin_model.RECIPES


class ConfigError(ValueError):
    """A config that cannot run: the message names the key and the problem."""


@dataclass
class ModelConfig:
    """The policy model (`model.*`)."""

    path: str = "builtin:tiny"
    """builtin:tiny (the project's own 0.44M-parameter chat model, built once and cached), builtin:small (~25M, for
    benchmarks), builtin:tiny-grid (tiny, warm-started on examples/grid), a local Hugging Face model folder, or a
    Hub id (org/name[@revision], resolved through the Hugging Face cache to one commit for every node, see hub.py)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the rollout engines' weights (and of the learner's on GPU; a CPU learner keeps float32 masters)."""


@dataclass
class DataConfig:
    """Training and held-out prompts (`data.*`)."""

    train: str = "builtin:arithmetic"
    """Training prompts: builtin:arithmetic, builtin:grid, a .jsonl file, a datasets.save_to_disk folder, or
    parquet/json files."""
    eval: str = "builtin:arithmetic"
    """Held-out prompts, in the same forms as data.train."""
    train_size: int = 4000
    """Rows generated for builtin:arithmetic training data."""
    eval_size: int = 200
    """Rows generated for builtin:arithmetic held-out data."""
    prompt_column: str = "prompt"
    """The column holding the prompt (a string, or a list of chat messages)."""
    seed: int = 0
    """Seed of the built-in data generator."""


@dataclass
class RolloutConfig:
    """The rollout workers: one engine each (`rollout.*`)."""

    backend: Literal["vllm", "torch"] = "vllm"
    """Rollout engine: vllm (default, CPU and CUDA) or torch (transformers' generation on any device torch runs on:
    the fallback where vLLM does not run). Which supports what: docs/backends.md."""
    num_workers: int = 1
    """Rollout workers (vLLM engines); each step's prompts are split over them."""
    group_size: int = 8
    """Trajectories sampled per prompt (GRPO's group)."""
    prompts_per_step: int = 16
    """Prompts per optimizer step."""
    max_turns: int = 3
    """Assistant turns per episode."""
    max_tokens_per_turn: int = 48
    """Tokens the policy may generate in one turn."""
    max_total_tokens: int = 320
    """Token budget of a whole episode: prompt, turns and tool results."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold of training rollouts."""
    eval_temperature: float = 1.0
    """Sampling temperature of held-out evaluation (pass@1 of the policy as it is trained; 0 = greedy)."""
    kv_cache_gib: float = 0.0
    """KV-cache memory of a CPU engine, GiB; 0 = sized to the run: room for every sequence of one rollout call (at
    most max_num_seqs) at max_total_tokens, at least 16 MiB. vLLM CPU holds the whole cache resident."""
    max_num_seqs: int = 256
    """Sequences an engine runs at once."""
    num_cpus_per_worker: float = 0.5
    """Ray CPUs reserved per rollout worker."""
    use_gpu: bool = False
    """Engines run on CUDA; how many GPUs each one gets is the placement plan's (`placement.py`)."""
    tensor_parallel_size: int = 1
    """GPUs per engine (vLLM tensor parallelism), all on one node."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources every engine asks for (e.g. {"rollout_node": 1}) to pin engines to labelled nodes."""
    gpu_memory_utilization: float = 0.0
    """Fraction of a GPU's memory vLLM may take (weights + KV cache); 0 = from the placement mode (0.85 on a GPU
    of its own, 0.35 on a GPU shared with a learner rank)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks across the samples of a group and the turns of an episode."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra engine arguments we do not wrap, checked when the engine starts: names of vLLM's EngineArgs (vllm), or
    cache_implementation (dynamic|static) and compile (true|false) for the torch backend."""
    sleep_mode: Literal["auto", "always", "never"] = "auto"
    """Engine sleep between rollouts (vLLM's sleep mode level 1; the torch backend moves its weights to CPU memory),
    so a learner rank sharing the GPU gets its memory: auto = on when engines and learner ranks share GPUs
    (placement colocated) and sync.max_staleness=0; always needs GPU engines."""
    lora_mode: Literal["auto", "native", "merge"] = "auto"
    """How engines apply the synced LoRA adapter: native = vLLM's LoRA (a new LoRARequest per version), merge = into
    the base weights, read again from the model folder tensor by tensor at each update (the engine keeps no copy of
    them); auto = native on GPU engines, merge on CPU (engine_modes.py)."""
    enforce_eager: bool = True
    """Run vLLM without CUDA graphs (required on CPU)."""
    system_prompt: str = ""
    """System message put before every prompt that has none (the chat template lists the tools after it)."""
    num_threads: int = 0
    """CPU threads of each engine; 0 = from the node's cores (see agentrl_ray/threads.py)."""


@dataclass
class EnvConfig:
    """The environment and its host actors (`env.*`)."""

    name: str = "agentrl_ray.envs.calculator:CalculatorEnv"
    """Import path package.module:Class of the TRL-style environment (its public methods are the tools)."""
    tools: list[str] = field(default_factory=list)
    """Plain functions added as tools ("package.module:function"); with env.name "" they are the only tools."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    num_actors: int = 1
    """Env host actors; each holds the environments of many trajectories."""
    num_cpus_per_actor: float = 0.25
    """Ray CPUs reserved per env host."""
    tool_timeout_s: float = 10.0
    """Seconds a tool call, step, reset, reward or constructor may take before it becomes the trajectory's error."""
    isolation: Literal["auto", "thread", "process", "sandbox"] = "auto"
    """Where each trajectory's environment runs: host threads, its own child process (killed on timeout or crash),
    that child sandboxed (own uid, no network, private /tmp; root only), or auto: thread for agentrl_ray.envs.*,
    process for any other environment. Costs and why: docs/reliability.md."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources every env host asks for (pins env hosts to labelled nodes)."""


@dataclass
class RewardConfig:
    """Reward functions and their weights (`reward.*`)."""

    functions: list[str] = field(default_factory=lambda: ["answer_match"])
    """Built-in names (answer_match, format, tool_success, efficiency, env_reward) or import paths pkg.mod:function."""
    weights: list[float] = field(default_factory=lambda: [1.0])
    """One weight per reward function; the reward is their weighted sum."""
    max_failing_steps: int = 3
    """Stop the run when one reward function fails on every sample of this many steps in a row."""


@dataclass
class AlgorithmConfig:
    """The GRPO-family policy loss and data shaping (`algorithm.*`; see agentrl_ray/algorithms.py)."""

    baseline: Literal["mean", "rloo"] = "mean"
    """Advantage baseline: the group mean (GRPO) or leave-one-out (RLOO)."""
    advantage_scale: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the group's reward std, the batch's, or not at all (Dr. GRPO)."""
    epsilon: float = 0.2
    """Lower clip range of the PPO ratio."""
    epsilon_high: float = 0.2
    """Upper clip range of the PPO ratio (clip-higher, DAPO)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (GRPO) or per sequence (GSPO)."""
    num_iterations: int = 1
    """Optimizer passes over each step's batch."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        "token_mean"
    )
    """How per-token policy losses are reduced to the step's loss."""
    loss_norm_constant: int = 0
    """The constant length of seq_mean_token_sum_norm; 0 = rollout.max_total_tokens."""
    beta: float = 0.0
    """Weight of the KL penalty to the reference policy (0 = no reference model)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Estimator of the KL penalty."""
    tis_cap: float = 0.0
    """Truncated importance sampling: cap of the learner/rollout probability ratio (0 = off)."""
    dynamic_sampling: Literal["off", "drop", "resample"] = "off"
    """Groups whose rewards are all equal: keep them, drop them, or drop and refill (DAPO)."""
    max_resample_rounds: int = 3
    """Refill rounds per step with dynamic_sampling=resample."""
    mask_truncated: bool = False
    """Leave trajectories cut by the token budget out of the policy loss (DAPO overlong filtering)."""
    overlong_penalty_tokens: int = 0
    """Soft overlong penalty: length of the ramp before rollout.max_total_tokens (0 = off)."""
    overlong_penalty_factor: float = 1.0
    """Soft overlong penalty at the full budget."""


@dataclass
class EchoConfig:
    """ECHO: the world-model loss on environment tokens (`echo.*`; see docs/echo.md)."""

    coeff: float = 0.0
    """Lambda: weight of the cross-entropy on environment (tool-output) tokens; 0 = plain GRPO."""
    schedule: Literal["constant", "linear", "step"] = "constant"
    """How lambda changes over steps: constant, linear to final_coeff, or one drop to it."""
    final_coeff: float = 0.0
    """Lambda after echo.decay_steps (linear and step schedules)."""
    decay_steps: int = 0
    """Steps of the linear decay, or the step of the drop."""
    normalization: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """Reduction of the environment-token loss, named as algorithm.loss_aggregation's modes."""
    only: bool = False
    """Train on the ECHO loss alone (rewards are ignored)."""


@dataclass
class LoraConfig:
    """LoRA adapters for the learner (`learner.lora.*`)."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight (only the adapter is synced)."""
    r: int = 16
    """Rank of the adapters."""
    alpha: int = 32
    """LoRA alpha (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapters' input."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the linear layers that get adapters."""
    quantize: Literal["none", "nf4"] = "none"
    """QLoRA: hold the learner's frozen base in 4-bit NF4 (bitsandbytes); the engines keep model.dtype weights."""


@dataclass
class LearnerConfig:
    """The Ray Train learner (`learner.*`)."""

    backend: Literal["ddp", "deepspeed"] = "ddp"
    """Plain DDP (gloo on CPU, NCCL on GPU) or DeepSpeed ZeRO."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (0-3)."""
    num_workers: int = 1
    """Learner ranks (Ray Train workers)."""
    use_gpu: bool = False
    """Train on GPUs, one per rank."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs reserved per learner rank."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources every learner rank asks for (pins the ranks to labelled nodes)."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay of the learning rate after warm-up, over run.steps (learner/schedule.py)."""
    min_lr_ratio: float = 0.0
    """Floor of a linear/cosine decay, as a fraction of learner.lr."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    max_nonfinite_steps: int = 3
    """Steps in a row whose loss or gradients are NaN/inf (each skipped, weights kept) before the run stops."""
    micro_batch_size: int = 32
    """Sequences per forward/backward on one rank."""
    torch_threads: int = 0
    """CPU threads of each learner rank; 0 = the node's cores shared by its ranks (see agentrl_ray/threads.py)."""
    bf16: bool = False
    """DDP learner: bfloat16 autocast with float32 weights and optimizer (DeepSpeed uses its own settings); with LoRA
    the frozen base is loaded in bfloat16 (no float32 copy), the adapter stays float32."""
    chunked_logprobs: bool = True
    """Log-probabilities from the last hidden states chunk by chunk (agentrl_ray/chunked_logprobs.py), never the whole
    (batch, tokens, vocabulary) logits; false: the model's full logits. Falls back to full logits under ZeRO-3."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass (Hugging Face `gradient_checkpointing_enable`):
    activation memory of one layer instead of all, for ~30% more compute. Works with DDP, DeepSpeed and LoRA."""
    compile: bool = False
    """Compile each decoder layer with `torch.compile` (inductor, dynamic shapes: one compiled graph serves every
    layer, micro-batch and sequence length), fusing the layer's non-matmul work (norms, rotary, activations, LoRA's
    extra matmuls and adds). The first step pays the compilation (tens of seconds on a few cores; inductor caches it
    on disk for the next run); on a CPU it needs a C++ compiler. Not with ZeRO-3 (partitioned parameters). Measured
    in docs/benchmarks.md."""
    offload_optimizer: bool = False
    """DeepSpeed only: keep optimizer state (and the fp32 master weights) in CPU memory, stepped by DeepSpeed's CPU
    Adam (`zero_optimization.offload_optimizer`)."""
    offload_params: bool = False
    """DeepSpeed ZeRO-3 only: keep the parameter partitions in CPU memory between uses
    (`zero_optimization.offload_param`)."""
    deepspeed_config: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed only: a DeepSpeed config (nested mapping) merged over the one built from these keys, key by key,
    for anything not wrapped here (e.g. `{zero_optimization: {stage3_prefetch_bucket_size: 5e7}}`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""


@dataclass
class SyncConfig:
    """Weight sync from the learner to the rollout engines after every step (`sync.*`)."""

    transport: Literal["object_store", "collective", "ipc"] = "object_store"
    """Ray's object store; a gloo/NCCL broadcast group between learner rank 0 and the engines; or ipc: CUDA IPC
    handles from learner rank 0 to the engines on its GPU, never through host memory (chosen for a colocated plan on
    one GPU; on CPU the tensors travel by value)."""
    max_staleness: int = 0
    """0: on-policy; 1: step t+1 is sampled while step t trains (one version behind)."""
    bucket_mb: int = 256
    """Collective and ipc transports: MiB per bucket (collective: the extra memory on either end)."""


@dataclass
class PlacementConfig:
    """Where engines, env hosts and learner ranks run (`placement.*`, see placement.py)."""

    mode: Literal["auto", "separate", "colocated"] = "auto"
    """separate: engines and learner ranks on different GPUs; colocated: each GPU holds an engine and a learner
    rank (fractional Ray GPUs), so one GPU works; auto: separate with >= 2 GPUs in the cluster, else colocated."""
    timeout_s: float = 120.0
    """Seconds to wait for Ray to reserve the plan's placement groups before failing (never a silent hang)."""


@dataclass
class RecoveryConfig:
    """Surviving dead and stuck actors (`recovery.*`; deadlines.py, rollout/recovery.py, docs/reliability.md)."""

    max_actor_restarts: int = 3
    """Restarts Ray grants each rollout worker and env host (their lost work is redone); past it the run stops."""
    max_learner_failures: int = 1
    """Learner failures Ray Train restarts from the latest checkpoint (FailureConfig.max_failures; errors count too)."""
    decode_step_s: float = 2.0
    """Upper bound on one decode step of an engine's full batch, s; a rollout's deadline is built from it."""
    slack_s: float = 120.0
    """Seconds added to every derived deadline (weight loads, prefill, scheduling)."""
    actor_start_s: float = 600.0
    """Seconds a restarted actor may take to answer again (an engine loads its model anew)."""
    learner_unresponsive_s: float = 600.0
    """A learner rank that does not answer Ray Train's health check for this long (its process frozen or stuck
    outside Python) is declared dead, and the learner restarts from the latest checkpoint like after a crash."""


@dataclass
class RunConfig:
    """The run: steps, outputs, evaluation, checkpoints (`run.*`)."""

    name: str = "calculator"
    """Name of the run: its folder under run.output_dir."""
    output_dir: str = "runs"
    """Driver-side folder of the run's metrics, plots, config and summary: output_dir/name. Relative paths resolve
    against the working directory, or inside a submitted Ray job against $AGENTRL_HOME (default: the home folder)."""
    storage_path: str = ""
    """Where checkpoints live (Ray Train storage): a local path, a shared filesystem, or s3:// / gs://.
    Empty: output_dir. Several nodes need a path every node sees (shared FS or a cloud URI)."""
    steps: int = 30
    """Optimizer steps."""
    seed: int = 0
    """Seed of prompt order, sampling and initialization."""
    checkpoint_every: int = 10
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (0 = all)."""
    resume: bool = False
    """Continue the run of this name from its last checkpoint."""
    eval_every: int = 10
    """Held-out evaluation every N steps (0 = only at the end)."""
    eval_at_start: bool = True
    """Evaluate before the first step."""
    eval_samples: int = 2
    """Samples per held-out prompt."""
    success_threshold: float = 1.0
    """A trajectory succeeds when its reward reaches this."""
    wandb: bool = False
    """Log metrics to Weights & Biases."""
    wandb_mode: Literal["online", "offline"] = "offline"
    """Weights & Biases mode."""
    wandb_project: str = "agentrl_ray"
    """Weights & Biases project."""
    plot: bool = True
    """Write reward_curve.png at the end."""
    save_rollouts: int = 0
    """Write every N-th step's rollouts to <run_dir>/rollouts/step_<step>.jsonl as OpenAI-style messages (0 = never)."""
    save_rollouts_groups: int = 0
    """At most this many groups per saved step (whole groups, so preference pairs survive); 0 = all."""
    sync_check: bool = False
    """After every weight push, compare each engine's greedy tokens with transformers on the weights pushed
    (metrics sync/greedy_match, sync/logprob_gap): a debugging aid for new hardware or backends; it holds one more
    copy of the model on learner rank 0's device (learner/sync_check.py)."""
    early_stopping_patience: int = 0
    """Stop after this many evaluations without improvement of run.early_stopping_metric (0 = never stop early)."""
    early_stopping_metric: str = "eval/success"
    """Held-out metric watched by early stopping (an eval/ key of metrics.jsonl)."""
    early_stopping_min_delta: float = 0.0
    """An evaluation improves only when it beats the best so far by more than this."""
    early_stopping_mode: Literal["max", "min"] = "max"
    """max: higher is better (success, reward); min: lower is better (eval/env_token_ce)."""


@dataclass
class Config:
    """A whole run: one section per role."""

    profile: Literal["auto", "cpu", "lora", "gpu"] = "auto"
    """Hardware preset under the YAML and overrides; auto picks gpu when CUDA devices are visible, else cpu."""
    stability: Literal["conservative", "balanced", "aggressive"] = "balanced"
    """Preset of learning rate, clipping, KL and batch size, layered over the profile (stability.py)."""
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
    """The ECHO world-model loss."""
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


# Keys that old configs may still set, and what to do instead.
REMOVED_KEYS = {
    "reward.answer_column": "it was never read. answer_match compares against the dataset's `answer` column: "
    "rename your column to `answer`, or pass a reward function of your own that reads it",
}


def _build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    prefix = f"{where}." if where else ""
    for key in unknown:
        if prefix + key in REMOVED_KEYS:
            raise ConfigError(f"config key {prefix + key} was removed: {REMOVED_KEYS[prefix + key]}")
    if unknown:
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


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> Config:
    """YAML file, then nested `values` (the Python API's arguments), then dotted overrides → validated Config,
    with the profile preset applied underneath."""
    user = load_yaml(path) if path is not None else {}
    user = deep_merge(deep_merge(user, values or {}), parse_overrides(overrides or []))
    requested = user.get("profile", "auto")
    _check_value(requested, typing.get_type_hints(Config)["profile"], "profile")
    from agentrl_ray.cluster_hardware import target_hardware

    hardware = target_hardware()  # the Ray cluster's nodes when there is one, else this machine: read once
    profile = resolve_profile(requested, hardware)
    stability = user.get("stability", "balanced")
    if stability not in STABILITY:
        raise ConfigError(f"stability: {stability!r} is not one of {', '.join(STABILITY)}")
    # Layers, later ones winning: defaults -> profile -> stability preset -> YAML -> overrides.
    preset = profile_preset(profile, hardware)
    preset = deep_merge(preset, stability_preset(stability, preset))
    merged = deep_merge(preset, {**user, "profile": profile})
    cfg = _build(Config, merged)
    validate(cfg)
    # Relative to where the command runs (Ray Train workers run in another working directory), or to a stable
    # folder inside a submitted Ray job's temporary working dir (storage.py).
    from agentrl_ray.storage import resolve_path

    cfg.run.output_dir = resolve_path(cfg.run.output_dir)
    cfg.run.storage_path = resolve_path(cfg.run.storage_path)
    return cfg


def config_from_dict(data: dict[str, Any]) -> Config:
    """A config from a nested dict holding every key (a run's config.json, the Python API), validated."""
    cfg = _build(Config, data)
    validate(cfg)
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
    need(r.num_workers >= 0, "rollout.num_workers must be >= 0 (0 = sized from the cluster's GPUs)")
    need(r.tensor_parallel_size >= 1, "rollout.tensor_parallel_size must be at least 1")
    need(
        r.use_gpu or r.tensor_parallel_size == 1,
        "rollout.tensor_parallel_size > 1 needs rollout.use_gpu=true (tensor parallelism splits an engine over GPUs)",
    )
    need(
        r.sleep_mode != "always" or r.use_gpu,
        "rollout.sleep_mode=always needs rollout.use_gpu=true: engines sleep on accelerators only, not on CPU",
    )
    need(
        r.lora_mode != "native" or lr.lora.enabled,
        "rollout.lora_mode=native applies a LoRA adapter in the engine: it needs learner.lora.enabled=true",
    )
    need(
        r.backend == "vllm" or r.tensor_parallel_size == 1,
        "rollout.tensor_parallel_size > 1 is vLLM's tensor parallelism: the torch backend runs one device per engine",
    )
    need(
        r.backend == "vllm" or r.lora_mode != "native",
        "rollout.lora_mode=native is vLLM's LoRA; the torch backend merges adapters: use rollout.lora_mode=merge",
    )
    need(0 <= r.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization must be in [0, 1] (0 = from placement)")
    need(cfg.placement.timeout_s > 0, "placement.timeout_s must be > 0")
    rc = cfg.recovery
    need(rc.max_actor_restarts >= 0, "recovery.max_actor_restarts must be >= 0")
    need(rc.max_learner_failures >= 0, "recovery.max_learner_failures must be >= 0")
    need(
        min(rc.decode_step_s, rc.slack_s, rc.actor_start_s, rc.learner_unresponsive_s) > 0,
        "recovery: deadlines must be > 0 seconds",
    )
    for section, res in (("rollout", r.resources), ("env", cfg.env.resources), ("learner", lr.resources)):
        need(
            not ({"CPU", "GPU", "memory"} & set(res)),
            f"{section}.resources holds custom resources only: set CPUs/GPUs with their own keys, got {sorted(res)}",
        )
        need(all(v >= 0 for v in res.values()), f"{section}.resources: amounts must be >= 0")
    need(
        cfg.model.path.startswith("builtin:") or "://" not in cfg.model.path,
        f"model.path {cfg.model.path!r}: a local folder or a Hugging Face Hub id, not a URL",
    )
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
    need(r.kv_cache_gib >= 0, "rollout.kv_cache_gib must be >= 0 (0 = sized to the run)")
    need(cfg.env.num_actors >= 0, "env.num_actors must be >= 0 (0 = one env host per engine)")
    need(cfg.env.tool_timeout_s > 0, "env.tool_timeout_s must be > 0")
    need(
        cfg.env.isolation in ("auto", "thread", "process", "sandbox"),
        f"env.isolation must be auto, thread, process or sandbox, got {cfg.env.isolation!r}",
    )
    need(
        ":" in cfg.env.name or (cfg.env.name == "" and bool(cfg.env.tools)),
        f"env.name {cfg.env.name!r} must be an import path 'package.module:Class' (or \"\" with env.tools)",
    )
    for i, tool in enumerate(cfg.env.tools):
        need(":" in tool, f"env.tools[{i}] {tool[:60]!r} must be an import path 'package.module:function'")
    need(
        len(cfg.reward.functions) == len(cfg.reward.weights),
        f"reward.functions has {len(cfg.reward.functions)} entries but reward.weights has "
        f"{len(cfg.reward.weights)}: give one weight per function",
    )
    need(bool(cfg.reward.functions) or e.only, "reward.functions is empty: nothing to train on")
    need(cfg.reward.max_failing_steps >= 1, "reward.max_failing_steps must be at least 1")
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
    need(lr.num_workers >= 0, "learner.num_workers must be >= 0 (0 = sized from the cluster's GPUs)")
    need(0 <= lr.min_lr_ratio <= 1, "learner.min_lr_ratio must be in [0, 1]")
    need(lr.warmup_steps >= 0, "learner.warmup_steps must be >= 0")
    need(cfg.run.save_rollouts >= 0 and cfg.run.save_rollouts_groups >= 0, "run.save_rollouts* must be >= 0")
    need(cfg.run.early_stopping_patience >= 0, "run.early_stopping_patience must be >= 0 (0 = off)")
    need(
        cfg.run.early_stopping_patience == 0 or cfg.run.early_stopping_metric.startswith("eval/"),
        f"run.early_stopping_metric {cfg.run.early_stopping_metric!r} must be a held-out eval/ metric",
    )
    need(
        cfg.run.early_stopping_patience == 0 or cfg.run.eval_every > 0,
        "run.early_stopping_patience needs run.eval_every > 0: early stopping watches the periodic evaluations",
    )
    need(lr.lr > 0, "learner.lr must be > 0")
    need(len(lr.betas) == 2, "learner.betas must hold two numbers")
    need(lr.micro_batch_size >= 1, "learner.micro_batch_size must be at least 1")
    need(lr.max_nonfinite_steps >= 1, "learner.max_nonfinite_steps must be at least 1")
    need(lr.zero_stage in (0, 1, 2, 3), "learner.zero_stage must be 0, 1, 2 or 3")
    need(
        not (lr.lora.enabled and lr.backend == "deepspeed" and lr.zero_stage == 3),
        "learner.lora with DeepSpeed ZeRO-3 is not supported: use zero_stage<=2",
    )
    need(
        not (lr.compile and lr.backend == "deepspeed" and lr.zero_stage == 3),
        "learner.compile with DeepSpeed ZeRO-3 is not supported (its partitioned parameters are gathered by hooks "
        "inside each layer): use zero_stage<=2 or learner.compile=false",
    )
    need(
        lr.lora.quantize == "none" or lr.lora.enabled,
        "learner.lora.quantize=nf4 quantizes the frozen base under LoRA adapters: it needs learner.lora.enabled=true",
    )
    need(
        lr.lora.quantize == "none" or lr.backend == "ddp",
        "learner.lora.quantize=nf4 runs with learner.backend=ddp only (DeepSpeed would partition the 4-bit weights)",
    )
    _validate_deepspeed(lr, need)
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
    need(
        "://" not in cfg.run.output_dir,
        f"run.output_dir {cfg.run.output_dir!r} must be a local folder (metrics and plots are written on the driver); "
        "put checkpoints in the cloud with run.storage_path=s3://... or gs://...",
    )
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


def _validate_deepspeed(lr: LearnerConfig, need) -> None:
    """The DeepSpeed-only learner keys need `learner.backend=deepspeed` (and parameter offload needs ZeRO-3)."""
    ds = lr.backend == "deepspeed"
    for key in ("offload_optimizer", "offload_params", "deepspeed_config"):
        need(ds or not getattr(lr, key), f"learner.{key} needs learner.backend=deepspeed (it is {lr.backend!r})")
    need(
        not lr.offload_optimizer or lr.zero_stage >= 1,
        "learner.offload_optimizer needs learner.zero_stage >= 1 (DeepSpeed offloads ZeRO's optimizer partitions)",
    )
    need(
        not lr.offload_params or lr.zero_stage == 3,
        f"learner.offload_params needs learner.zero_stage=3 (only ZeRO-3 partitions parameters; it is {lr.zero_stage})",
    )
    stage = lr.deepspeed_config.get("zero_optimization", {})
    need(
        isinstance(stage, dict) and stage.get("stage", lr.zero_stage) == lr.zero_stage,
        "learner.deepspeed_config.zero_optimization.stage must not differ from learner.zero_stage: set "
        "learner.zero_stage (the learner's gather, save and load depend on it)",
    )
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        need(
            key not in lr.deepspeed_config,
            f"learner.deepspeed_config.{key} is set by the learner (learner.micro_batch_size; accumulation is "
            "driven per step): remove it",
        )
