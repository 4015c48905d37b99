"""What learns: the policy loss (`algorithm.*`), the ECHO loss (`echo.*`) and the learner (`learner.*`, with
`learner.lora.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl_ray.config.checking import check_resources, need


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
    """Off-policy correction of the learner/rollout mismatch, on when > 0: the cap (or the band's top, `masked`) of
    each token's ratio w = pi_learner_old / pi_rollout."""
    is_correction: Literal["truncated", "masked", "sequence"] = "truncated"
    """With tis_cap > 0: weight each token by min(w, cap) (TIS), or by w inside [is_band_low, cap] and leave the
    tokens outside out (masked IS, ICEPOP), or weight every token of a sequence by min(geometric mean of its w, cap)."""
    is_band_low: float = 0.5
    """The bottom of the masked correction's band."""
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

    def check(self) -> None:
        need(0 <= self.epsilon < 1 and 0 <= self.epsilon_high, "algorithm.epsilon must be in [0, 1), epsilon_high >= 0")
        need(self.num_iterations >= 1, "algorithm.num_iterations must be at least 1")
        need(self.beta >= 0, "algorithm.beta must be >= 0")
        need(self.tis_cap == 0 or self.tis_cap >= 1, "algorithm.tis_cap must be 0 (off) or >= 1")
        need(0 < self.is_band_low <= 1, "algorithm.is_band_low must be in (0, 1]")


@dataclass
class EchoConfig:
    """ECHO: the cross-entropy loss on environment tokens (`echo.*`; see docs/echo.md)."""

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

    def check(self) -> None:
        need(self.coeff >= 0 and self.final_coeff >= 0, "echo.coeff and echo.final_coeff must be >= 0")
        need(not self.only or self.coeff > 0, "echo.only=true needs echo.coeff > 0")
        need(
            self.schedule == "constant" or self.decay_steps > 0, "echo.schedule linear/step needs echo.decay_steps > 0"
        )


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
    """Sequences per forward/backward on one rank, at most."""
    micro_batch_tokens: int = 0
    """With > 0, also at most this many padded tokens (sequences x the longest) per forward/backward, down to one
    sequence: short sequences train in few large micro-batches, long ones in many small ones. The GPU profile sets
    32 sequences and 32,768 tokens (4 sequences of its 8,192-token maximum: the memory of its former fixed 4);
    docs/learner_speed.md measured one micro-batch of 16 x 1,024 9% faster than two of 8."""
    torch_threads: int = 0
    """CPU threads of each learner rank; 0 = the node's cores shared by its ranks (see agentrl_ray/infra/threads.py)."""
    release_memory: bool = True
    """CPU learner: at the end of each update give the memory it freed (the micro-batches' activations) back to the
    kernel (glibc's malloc_trim), so that it is not held while the engines sample. `false` keeps it mapped for the
    next update, which then does not page-fault it in again. At the 0.5B LoRA bfloat16 shape on 2 cores, in two
    pairs of runs: a steady step 3-15 s shorter (of 115-125 s; the runs of one setting spread by ~8 s), for 1.1-1.3
    GiB more peak memory summed over the run's processes (the learner's heap and the engine's rollout are then
    resident together; docs/history/benchmarks.md round 8). For a machine with memory to spare."""
    bf16: bool = False
    """DDP learner: bfloat16 autocast with float32 weights and optimizer (DeepSpeed uses its own settings); with LoRA
    the frozen base is loaded in bfloat16 (no float32 copy), the adapter stays float32."""
    chunked_logprobs: bool = True
    """Log-probabilities from the last hidden states chunk by chunk (agentrl_ray/learner/levers/chunked_logprobs.py),
    never the whole (batch, tokens, vocabulary) logits; false: the model's full logits. Falls back to full logits
    under ZeRO-3."""
    shared_prefix: Literal["auto", True, False] = "auto"
    """Tokens that every sequence of a micro-batch begins with (a group's prompt; a task's system prompt and tool
    schemas) go through the layers once, not once per sequence (agentrl_ray/learner/levers/shared_prefix.py): the
    micro-batch is packed into one row and attention runs per sequence over the prefix and its own tokens; the
    micro-batches are cut along shared prompts where that computes fewer tokens than cutting by length. Not
    bit-exact (the matmuls see other shapes: float rounding). `auto` (default): on for a CPU learner (0.5B LoRA
    bfloat16, 4 sequences a micro-batch, 2 cores: the learner benchmark's step 12-18% shorter with 58-token prompts,
    42% with 512-token ones; docs/benchmarks.md), off on a GPU (0.5B full fine-tune on an H100, 512-token prompts:
    no shorter step, the step there waits on the host; docs/history/learner_speed.md round 4); `true` on a GPU too.
    Models whose layers all attend causally over the whole sequence through Hugging Face's SDPA attention; others, and
    left-padded batches, run unpacked."""
    skip_zero_gradient_rows: bool = True
    """Leave out of the forward and backward passes the rows whose loss has no gradient: advantage 0 (a group whose
    rewards are all equal), with algorithm.beta=0 and no ECHO term on the row (no environment tokens, or
    echo.coeff 0 at that step), or a truncated row under algorithm.mask_truncated without one. They still count in
    the loss's denominators, so the gradient is the one of every row (float rounding aside: the micro-batches hold
    other rows), unlike algorithm.dynamic_sampling=drop, which changes them. A step whose rows all lack a gradient
    still steps the optimizer, on one zero-weight row (AdamW's momentum and weight decay move the weights). The
    row-level metrics (entropy, ratio, learner/rollout mismatch) then describe the computed rows only;
    `loss/zero_gradient_rows` counts the others either way. The default run leaves out 29% of its rows and its
    learner time falls 28% (docs/history/benchmarks.md, round 17). false: every row is computed (as TRL does)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass (Hugging Face `gradient_checkpointing_enable`):
    activation memory of one layer instead of all, for ~30% more compute. Works with DDP, DeepSpeed and LoRA."""
    compile: Literal["auto", True, False] = "auto"
    """Compile each decoder layer with `torch.compile` (inductor, dynamic shapes: one compiled graph serves every
    layer, micro-batch and sequence length), fusing the layer's non-matmul work (norms, rotary, activations, LoRA's
    extra matmuls and adds) and the head's log-softmax chunks. The first step pays the compilation (tens of seconds
    on a few cores; inductor caches it on disk for the next run); on a CPU it needs a C++ compiler. Not with ZeRO-3
    (partitioned parameters). Not exact: the compiled kernels round differently from eager ones (log-prob gap
    ~0.04 in bfloat16). `auto` (default): on for a model of at least 200M parameters, where its savings repay the
    compilation (measured at 0.5B on a CPU: 1.2-2.1 GiB less peak memory, the step level with eager;
    on a GPU the step 1.6x (0.5B) to 1.8x (1.5B) faster; docs/benchmarks.md), if it can run there (a C++ compiler
    on a CPU, no ZeRO-3, a model that names its decoder layers) and is measured (not a 4-bit QLoRA base); off below
    that, or else (logged). `true` insists (an error where it cannot run), `false` never compiles."""
    compile_buckets: int = 0
    """With > 0 (and the layers compiled): every forward's sequences are right-padded to a multiple of this many
    tokens and the layers compile one fixed-shape graph for each such length (and each number of rows) instead of
    one graph with dynamic shapes. On an H200 a fixed shape made the 0.5B full fine-tune's step 11% shorter (32.3%
    against 28.6% MFU, docs/history/learner_speed.md round 3); padding to multiples of 128 costs at most 127 tokens a
    row, never scored (right padding: a causal model's real tokens do not see it). Each new length compiles when it
    first appears (on a GPU tens of seconds; the on-disk cache keeps them for the next run), so a run of lengths up
    to 1,024 compiles up to 8 graphs (16 with the no-grad forwards of metrics). On a CPU a fixed shape was no faster
    (docs/history/benchmarks.md round 9). 0 (default): dynamic shapes. Not with `shared_prefix=true` (its packed rows
    change shape with each prompt)."""
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

    def check(self) -> None:
        need(self.num_workers >= 0, "learner.num_workers must be >= 0 (0 = sized from the cluster's GPUs)")
        check_resources("learner", self.resources)
        need(0 <= self.min_lr_ratio <= 1, "learner.min_lr_ratio must be in [0, 1]")
        need(self.warmup_steps >= 0, "learner.warmup_steps must be >= 0")
        need(self.lr > 0, "learner.lr must be > 0")
        need(len(self.betas) == 2, "learner.betas must hold two numbers")
        need(self.micro_batch_size >= 1, "learner.micro_batch_size must be at least 1")
        need(self.micro_batch_tokens >= 0, "learner.micro_batch_tokens must be >= 0 (0 = sequences only)")
        need(self.compile_buckets >= 0, "learner.compile_buckets must be >= 0 (0 = dynamic shapes)")
        need(
            not (self.compile_buckets > 0 and self.shared_prefix is True),
            "learner.compile_buckets pads each forward to a fixed length; learner.shared_prefix=true packs rows into "
            "shapes that change with every prompt: set one of them off",
        )
        need(
            not (self.compile_buckets > 0 and self.compile is False),
            "learner.compile_buckets sets the shapes the compiled layers see: it needs learner.compile (auto or true)",
        )
        need(self.max_nonfinite_steps >= 1, "learner.max_nonfinite_steps must be at least 1")
        need(self.zero_stage in (0, 1, 2, 3), "learner.zero_stage must be 0, 1, 2 or 3")
        need(
            not (self.lora.enabled and self.backend == "deepspeed" and self.zero_stage == 3),
            "learner.lora with DeepSpeed ZeRO-3 is not supported: use zero_stage<=2",
        )
        need(
            not (self.compile != "auto" and self.compile and self.backend == "deepspeed" and self.zero_stage == 3),
            "learner.compile with DeepSpeed ZeRO-3 is not supported (its partitioned parameters are gathered by hooks "
            "inside each layer): use zero_stage<=2 or learner.compile=false",
        )
        need(
            self.lora.quantize == "none" or self.lora.enabled,
            "learner.lora.quantize=nf4 quantizes the frozen base under LoRA adapters: it needs "
            "learner.lora.enabled=true",
        )
        need(
            self.lora.quantize == "none" or self.backend == "ddp",
            "learner.lora.quantize=nf4 runs with learner.backend=ddp only (DeepSpeed would partition the 4-bit "
            "weights)",
        )
        self._check_deepspeed()

    def _check_deepspeed(self) -> None:
        """The DeepSpeed-only learner keys need `learner.backend=deepspeed` (and parameter offload needs ZeRO-3)."""
        ds = self.backend == "deepspeed"
        for key in ("offload_optimizer", "offload_params", "deepspeed_config"):
            need(
                ds or not getattr(self, key), f"learner.{key} needs learner.backend=deepspeed (it is {self.backend!r})"
            )
        need(
            not self.offload_optimizer or self.zero_stage >= 1,
            "learner.offload_optimizer needs learner.zero_stage >= 1 (DeepSpeed offloads ZeRO's optimizer partitions)",
        )
        need(
            not self.offload_params or self.zero_stage == 3,
            "learner.offload_params needs learner.zero_stage=3 (only ZeRO-3 partitions parameters; it is "
            f"{self.zero_stage})",
        )
        stage = self.deepspeed_config.get("zero_optimization", {})
        need(
            isinstance(stage, dict) and stage.get("stage", self.zero_stage) == self.zero_stage,
            "learner.deepspeed_config.zero_optimization.stage must not differ from learner.zero_stage: set "
            "learner.zero_stage (the learner's gather, save and load depend on it)",
        )
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
            need(
                key not in self.deepspeed_config,
                f"learner.deepspeed_config.{key} is set by the learner (learner.micro_batch_size; accumulation is "
                "driven per step): remove it",
            )
