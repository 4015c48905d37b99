"""QLoRA: the learner's frozen base in 4-bit NF4 (bitsandbytes) under float LoRA adapters (`learner.lora.quantize`).

A memory lever for bases whose weights dominate the learner: at the 0.5B-class shape the 24 layers' 358M weights take
0.18 GB in NF4 instead of 0.72 GB in bfloat16, yet on CPU the learner's resident set did not shrink there (the
bfloat16 base is mapped from its file and the steps' working set dominates; docs/benchmarks.md). The embedding, which
is also the tied head, stays in the compute dtype: bitsandbytes quantizes Linear layers only, and our chunked head
reads its weight directly. Only the learner quantizes. The engines keep
`model.dtype` weights and merge (or apply) the same adapter, so the sampling policy is the full-precision base plus
the adapter while the learner differentiates the NF4 base plus the adapter: the PPO ratio against the sampling
log-probabilities absorbs the gap, and `algorithm.tis_cap` bounds it, as for any engine/learner numerics mismatch.

Left out on purpose: peft's `prepare_model_for_kbit_training` (it upcasts the embedding and norms to float32, +0.5 GB
at the 0.5B shape, and turns on reentrant checkpointing; our checkpointing is non-reentrant and needs no input
gradients), and DeepSpeed (ZeRO would partition the packed 4-bit tensors; `config.validate` refuses the pair).
"""

from __future__ import annotations

import torch

from agentrl_ray.config import ConfigError, LearnerConfig

INSTALL_HINT = "pip install 'agentrl_ray[qlora]' (bitsandbytes)"


def require_bitsandbytes() -> None:
    """ConfigError naming the key and the install step when bitsandbytes cannot be imported (the driver checks it
    before Ray starts)."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"learner.lora.quantize=nf4 needs bitsandbytes, which cannot be imported ({e}): {INSTALL_HINT}"
        ) from None


def compute_dtype(cfg: LearnerConfig) -> torch.dtype:
    """What the dequantized matmuls run in: bfloat16 on GPU or with `learner.bf16`, else float32."""
    return torch.bfloat16 if cfg.use_gpu or cfg.bf16 else torch.float32


def load_quantized(model_path: str, cfg: LearnerConfig, device: torch.device):
    """The model with every Linear layer of its blocks in NF4 (double-quantized scales), on `device`; the other
    weights (embedding and tied head, norms) in the compute dtype. Quantized models cannot be moved afterwards:
    they are placed while loading."""
    require_bitsandbytes()
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = compute_dtype(cfg)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=dtype, quantization_config=quantization, device_map={"": device}
    )
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            # On CPUs with AVX512-BF16, an eval-mode forward without gradients repacks the weight for inference in
            # place, a layout that has no backward: the learner's no-grad passes (old and reference log-probs)
            # would break every training step after them. Train mode keeps the trainable layout; the layer has
            # no dropout, so nothing else changes.
            module.train()
    return model


def packed_bytes(model) -> int:
    """Bytes of the 4-bit weight storage of a loaded model (its Linear4bit layers)."""
    import bitsandbytes as bnb

    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
