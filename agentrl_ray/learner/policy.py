"""The trainable policy inside one Ray Train worker: model, optional LoRA, DDP or DeepSpeed, optimizer.

`Policy` hides the wrapper behind five verbs the loop needs: `logits`, `backward`, `step`, `named_tensors_for_sync`
and `save`/`load`. DeepSpeed details (its config, ZeRO-3's partitioned build and gathers) live in `levers/zero.py`.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import torch

from agentrl_ray.config import LearnerConfig, ModelConfig
from agentrl_ray.infra.hardware import emulated_bf16_warning, this_cpu
from agentrl_ray.learner.levers import qlora, shared_prefix, zero
from agentrl_ray.learner.levers.chunked_logprobs import hidden_token_logprobs
from agentrl_ray.learner.levers.compilation import compile_layers, wants_compile
from agentrl_ray.learner.logprobs import token_logprobs_and_entropy
from agentrl_ray.sync.packing import load_safetensors_folder

TRAINER_STATE = "trainer_state.pt"
# DeepSpeed keeps a file named "latest" that names the tag folder: the tag must be another name.
DEEPSPEED_TAG = "state"
log = logging.getLogger("agentrl_ray")
FUSED_ADAMW = True  # (`benchmarks/run.py learner` turns it off to measure what it brings)
LORA_INPUT_UNCAST = True  # keep_adapter_inputs_uncast (the benchmark's `-peftcast` turns it off)


def lora_tensors(peft_model) -> list[tuple[str, torch.Tensor]]:
    """The adapter's A/B tensors, named after the base weight they modify (what sync.receiver merges)."""
    out = []
    for name, p in peft_model.named_parameters():
        if "lora_A" in name or "lora_B" in name:
            # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
            #   → model.layers.0.self_attn.q_proj.lora_A
            out.append((name.removeprefix("base_model.model.").replace(".default.weight", ""), p.detach().cpu()))
    return out


class Policy:
    def __init__(self, model_path: str, model_cfg: ModelConfig, cfg: LearnerConfig, *, need_reference: bool) -> None:
        import ray.train
        import ray.train.torch
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.device = ray.train.torch.get_device() if cfg.use_gpu else torch.device("cpu")
        self.rank = ray.train.get_context().get_world_rank()
        self.world_size = ray.train.get_context().get_world_size()
        self.ds_config = zero.deepspeed_config(cfg) if cfg.backend == "deepspeed" else None
        # ZeRO-3: from_pretrained builds the model inside zero.Init and loads the checkpoint into the partitions
        # while this object lives (no rank ever holds the whole model); it must outlive the reference model too.
        self.partitioned = cfg.backend == "deepspeed" and cfg.zero_stage == 3
        self._zero3_init = zero.partitioned_init(self.ds_config) if self.partitioned else None
        # Master weights stay float32 on CPU; on GPU DeepSpeed's bf16 mode keeps fp32 masters itself.
        load_dtype = torch.float32 if not cfg.use_gpu else getattr(torch, model_cfg.dtype)
        if cfg.lora.enabled and cfg.bf16 and self.ds_config is None:
            # The frozen base needs no float32 master copy: bf16 halves its memory and spares autocast's per-call
            # casts of every weight (PEFT keeps the adapter, the only trained part, in float32).
            load_dtype = torch.bfloat16
        # A bfloat16 base cannot run without autocast beside the float32 adapter: `exact` forwards keep it then.
        self.mixed_weights = load_dtype == torch.bfloat16 and cfg.lora.enabled
        if cfg.bf16 and not cfg.use_gpu and self.rank == 0:
            warning = emulated_bf16_warning(this_cpu(), "learner.bf16=true")
            if warning:
                log.warning("%s", warning)
        quantized = cfg.lora.quantize != "none"  # validate() allows it only with LoRA
        if quantized:
            model = qlora.load_quantized(model_path, cfg, self.device)  # placed on the device while loading
        else:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=load_dtype)
        # before PEFT wraps it: the attention implementation is the Hugging Face model's own setting
        # auto: on a CPU, unless the compiled layers take fixed shapes (learner.compile_buckets)
        share = (
            cfg.shared_prefix if cfg.shared_prefix != "auto" else self.device.type == "cpu" and not cfg.compile_buckets
        )
        self.shared_prefix = bool(share) and shared_prefix.install(model)
        if share and not self.shared_prefix and self.rank == 0:
            log.info("learner.shared_prefix: %s does not attend as it packs; unpacked", type(model).__name__)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.reference = None
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lora = cfg.lora
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
            self.lora_scaling = lora.alpha / lora.r
            if cfg.bf16 and self.ds_config is None and not quantized and LORA_INPUT_UNCAST:
                keep_adapter_inputs_uncast(model)
        else:
            self.lora_scaling = None
            if need_reference:
                # Full fine-tuning: the KL reference is a frozen copy (partitioned too under ZeRO-3, in an engine
                # without optimizer). LoRA disables the adapter instead.
                reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=load_dtype)
                reference.eval().requires_grad_(False)
                # token_logprobs packs the reference's batches as the policy's (the same architecture)
                self.shared_prefix = self.shared_prefix and shared_prefix.install(reference)
                if self.partitioned:
                    reference = zero.initialize(reference, None, self.ds_config)[0]
                self.reference = reference if self.partitioned else reference.to(self.device)
        # ZeRO-3: DeepSpeed places the partitions; a quantized model is already on its device and cannot move.
        self.module = model if self.partitioned or quantized else model.to(self.device)
        self.module.config.use_cache = False
        self.compiled = wants_compile(
            cfg.compile, self.module, self.device, self.partitioned, self.rank, quantized=quantized
        )
        # learner.compile_buckets: each forward right-padded to a multiple of it, for fixed-shape compiled layers
        self.bucket = cfg.compile_buckets if self.compiled else 0
        if self.compiled:  # validate() refuses learner.compile=true under ZeRO-3
            compiled = compile_layers(self.module, self.device, fixed_shapes=self.bucket > 0)
            if self.rank == 0:
                shapes = f"fixed shapes, lengths in multiples of {self.bucket}" if self.bucket else "dynamic shapes"
                log.info("learner.compile: %d decoder layers compile during the first step (%s)", compiled, shapes)
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.ds_config is not None:
            self.engine, self.optimizer = zero.initialize(self.module, params, self.ds_config)
            self.wrapped = self.engine
        else:
            self._init_ddp(params)

    def _init_ddp(self, params: list[torch.nn.Parameter]) -> None:
        # fused: one kernel for the whole update (torch's default is the multi-tensor one): on a CPU too, where it
        # is ~5.7x faster (44 against 249 ms for 100M float32 parameters on 2 cores, docs/deepspeed.md,
        # `benchmarks/run.py learner --mode cpu_adamw`)
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.cfg.lr,
            betas=tuple(self.cfg.betas),
            weight_decay=self.cfg.weight_decay,
            fused=FUSED_ADAMW or None,
        )
        self.engine = None
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.wrapped = DistributedDataParallel(
                self.module, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        else:
            self.wrapped = self.module

    # ---------------------------------------------------------------- compute

    def autocast(self):
        """`learner.bf16` on a float32 model: matmuls in bfloat16 (AMX on recent x86 CPUs), weights, gradients and
        optimizer state stay float32. DeepSpeed's own bf16 mode needs none of this."""
        if not self.cfg.bf16 or self.engine is not None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.wrapped(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B,T,V)

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        with_entropy: bool = True,
        *,
        model=None,
        needed: torch.Tensor | None = None,
        exact: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs and entropy (B, T) of `model` (default: the wrapped policy). With
        `learner.chunked_logprobs` the head runs chunk by chunk on the last hidden states (no (B, T, V) logits),
        only at the `needed` (B, T) positions when given (the others are 0: read them through a mask). `exact`: in the
        weights' own dtype, without `learner.bf16`'s autocast (the integrity probe compares them with the engines')."""
        length = input_ids.shape[1]
        if self.bucket and length % self.bucket:  # learner.compile_buckets: the next fixed length, padding unscored
            padded = pad_right(length, self.bucket, input_ids, attention_mask, needed)
            out = self.token_logprobs(*padded[:2], with_entropy, model=model, needed=padded[2], exact=exact)
            return tuple(None if x is None else x[:, :length] for x in out)
        model = self.wrapped if model is None else model
        head = model_head(model) if self.cfg.chunked_logprobs and not self.partitioned else None
        # A right-padded batch runs without its mask (right_padded), on a CPU too: there SDPA's flash kernel gives
        # the same numbers at the real positions either way (measured: bit-identical), its attention 3% faster.
        mask = None if right_padded(attention_mask) else attention_mask
        rows, prefix = input_ids.shape[0], 0
        if self.shared_prefix and mask is None:
            prefix = shared_prefix.common_prefix_length(input_ids)
            prefix = prefix if shared_prefix.worth_sharing(rows, prefix) else 0

        def forward() -> torch.Tensor:  # the model's `.logits` in the (B, T, ...) layout of input_ids
            if not prefix:
                return model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
            ids, positions, layout = shared_prefix.pack(input_ids, prefix)
            out = model(input_ids=ids, position_ids=positions, use_cache=False, **{shared_prefix.KWARG: layout})
            return shared_prefix.unpack(out.logits, rows, prefix)

        with contextlib.nullcontext() if exact and not self.mixed_weights else self.autocast():
            if head is None:
                return token_logprobs_and_entropy(forward(), input_ids, with_entropy)
            with hidden_states_out(head):
                hidden = forward()  # (B,T,H)
            return hidden_token_logprobs(
                hidden, head.weight, input_ids, with_entropy, needed=needed, fused=self.compiled
            )

    @torch.no_grad()
    def reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, needed: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.reference is not None:
            return self.token_logprobs(input_ids, attention_mask, False, model=self.reference, needed=needed)[0]
        with self.module.disable_adapter():
            return self.token_logprobs(input_ids, attention_mask, False, model=self.module, needed=needed)[0]

    def grad_sync_context(self, sync: bool):
        """DDP all-reduces only on the last micro-batch of a step."""
        if sync or self.engine is not None or self.wrapped is self.module:
            return contextlib.nullcontext()
        return self.wrapped.no_sync()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss)
        else:
            loss.backward()

    def step(self, lr: float) -> float:
        """Optimizer step with clipping; returns the global gradient norm."""
        if self.engine is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.engine.step()
            return float(self.engine.get_global_grad_norm() or 0.0)
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ---------------------------------------------------------------- weights

    def full_named_tensors(self, on_device: bool = False) -> list[tuple[str, torch.Tensor]]:
        """The whole model's tensors (Hugging Face names) on rank 0, [] on the others: copies in host memory, or
        with `on_device` the model's own tensors where they are (a sender that packs them on the GPU itself). Under
        ZeRO-3 a collective: every rank must call it (the gather runs in bounded groups,
        `zero.gathered_named_tensors`)."""
        if not self.partitioned:
            if self.rank != 0:
                return []
            return [(n, t.detach() if on_device else t.detach().cpu()) for n, t in self.module.state_dict().items()]
        named = zero.gathered_named_tensors(self.module)
        if self.rank == 0:
            return list(named)
        for _ in named:  # take part in every group's gather, keep nothing
            pass
        return []

    def named_tensors_for_sync(self, on_device: bool = False) -> list[tuple[str, torch.Tensor]]:
        """What rank 0 pushes to the engines: the full weights, or with LoRA only the A/B tensors (in host memory:
        the engine merges them there); [] on the other ranks. `on_device`: the full weights stay on the learner's
        device (`sync.sender.IpcSender` packs them there; a trip through host memory cost 0.87-1.07 s per GB
        on an H100, against 0.010-0.026 s per GB for the IPC handoff: docs/learner_speed.md).
        Every rank must call it (a collective under ZeRO-3)."""
        if self.lora_scaling is not None:
            return lora_tensors(self.module) if self.rank == 0 else []
        return self.full_named_tensors(on_device)

    def save(self, path: Path, extra_state: dict[str, Any], tokenizer) -> None:
        """HF-format model (or LoRA adapter) + tokenizer + optimizer/trainer state, into `path`. Every rank calls it:
        DeepSpeed writes each rank's partitions, and under ZeRO-3 the HF weights are gathered from every rank."""
        path.mkdir(parents=True, exist_ok=True)
        if self.engine is not None:
            self.engine.save_checkpoint(str(path / "deepspeed"), tag=DEEPSPEED_TAG)
        hf_dir = path / ("adapter" if self.lora_scaling is not None else "model")
        if self.partitioned:
            # Gathered full tensors in the training dtype (bf16 on GPU, float32 on CPU): the module's own are empty.
            weights = dict(self.full_named_tensors())
            if self.rank == 0:
                self.module.save_pretrained(hf_dir, state_dict=weights)
        elif self.rank == 0:
            self.module.save_pretrained(hf_dir)
        if self.rank != 0:
            return
        tokenizer.save_pretrained(hf_dir)
        state = dict(extra_state)
        if self.engine is None:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, path / TRAINER_STATE)

    def load(self, path: Path) -> dict[str, Any]:
        """Resume. DeepSpeed: its own checkpoint restores weights and optimizer partitions together, on the same
        number of ranks (the HF folder is the export, not the resume state). DDP/LoRA: the HF folder + the optimizer
        state in the trainer state."""
        state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)  # no code runs on load
        if self.engine is not None:
            load_dir, _ = self.engine.load_checkpoint(str(path / "deepspeed"), tag=DEEPSPEED_TAG)
            if load_dir is None:
                raise RuntimeError(f"checkpoint {path} holds no DeepSpeed state under deepspeed/{DEEPSPEED_TAG}")
            return state
        if self.lora_scaling is not None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.module, load_file(str(path / "adapter" / "adapter_model.safetensors")))
        else:
            weights = load_safetensors_folder(path / "model")
            missing, unexpected = self.module.load_state_dict(weights, strict=False)
            if unexpected or [m for m in missing if m != "lm_head.weight"]:
                raise RuntimeError(
                    f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}"
                )
        self.optimizer.load_state_dict(state["optimizer"])
        return state


def keep_adapter_inputs_uncast(model) -> None:
    """PEFT casts each LoRA layer's bfloat16 input to the adapter's float32 before the adapter's matmuls, and
    autocast casts it straight back to bfloat16: at the 0.5B shape 2,814 of a 16-sequence step's 11,913 copies
    (0.4-0.8 s of ~21 s). Under bfloat16 autocast both casts are exact (bfloat16 -> float32 -> bfloat16), so the
    input left in its dtype gives the same numbers without them. For a learner under autocast only
    (`Policy.autocast`, the adapter's only caller)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for m in model.modules():
        if isinstance(m, BaseTunerLayer):
            m.cast_input_dtype_enabled = False


def pad_right(length: int, multiple: int, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """(B, length) tensors right-padded with zeros (token 0, masked out, not needed) to the next multiple of
    `multiple`; None stays None."""
    extra = -length % multiple
    return [None if t is None else torch.nn.functional.pad(t, (0, extra)) for t in tensors]


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Every row is ones then zeros. Under causal attention a real token of such a batch never sees the padding
    after it, so the model can run without the mask: SDPA then takes its causal flash kernel instead of building a
    (B, 1, T, T) mask and running a masked kernel, and the padded positions (never scored) are all that change."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def model_head(model) -> torch.nn.Linear | None:
    """The model's output projection when it is a plain bias-free Linear (what the chunked path computes itself);
    None otherwise (e.g. a LoRA-wrapped head), and the full logits are used."""
    inner = getattr(model, "module", model)  # DDP keeps the model as .module
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if get is not None else None
    return head if type(head) is torch.nn.Linear and head.bias is None else None


@contextlib.contextmanager
def hidden_states_out(head: torch.nn.Linear):
    """The model's forward returns its last hidden states (B, T, H) as `.logits`: the head is made the identity for
    the call (an instance attribute shadows `forward`), so wrappers (DDP, DeepSpeed, PEFT) still run their hooks."""
    head.forward = lambda x: x
    try:
        yield
    finally:
        del head.forward


def enable_gradient_checkpointing(model) -> None:
    """Hugging Face checkpointing, non-reentrant (works under DDP, DeepSpeed and with frozen LoRA bases without
    `enable_input_require_grads`). HF checkpoints only in train mode, so the model is put there, with dropout
    disabled: the learner must compute the same log-probabilities as the engine that sampled."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
