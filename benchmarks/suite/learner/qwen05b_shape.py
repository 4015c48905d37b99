"""A model with Qwen2.5-0.5B's architecture and vocabulary, random bfloat16 weights, built locally (no model hub).

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py learner --mode qwen05b_shape    # builds it once (~1 GB, under a minute), prints its folder

Measures nothing: the modes that take `--model qwen05b` (trl_side_by_side, roofline, lora_sync, generation_phases,
backend_compare) build it; learner_throughput's `--shape 0.5b` takes its config.

The realistic benchmark shape: 24 layers, hidden 896, 14 query / 2 KV heads, intermediate 4864, vocabulary 151,936,
tied embeddings: 494M parameters, of which the 136M of the embedding are also the LM head's matmul. The config is
Qwen2.5-0.5B's published one; the weights are random (`initializer_range` 0.02), so the model's behaviour means
nothing: it is for throughput and memory, and its completions run to the length limit (EOS has ~1/151,936 chance
per token; both trainers also force the length). The tokenizer and chat template are the built-in model's
(`agentrl_ray.builtin.model`): its ~370 ids are valid ids of the larger vocabulary, and sampled ids beyond the
tokenizer decode to nothing, in our rollouts and in TRL alike. Both our trainer (`model.path=<folder>`) and TRL's
`GRPOTrainer` (`against_trl --mode trl_grpo_run --model-path <folder>`) load the folder.

The folder is `$AGENTRL_CACHE/models/qwen2.5-0.5b-shape-<hash of the config>`, built under a file lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

# Qwen2.5-0.5B-Instruct's config.json (architecture only).
QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def ensure_qwen05b_shape(cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    from agentrl_ray.builtin.cache import build_once
    from agentrl_ray.builtin.model import default_cache_root, ensure_builtin_model

    tokenizer_dir = ensure_builtin_model()
    key = json.dumps({"config": QWEN25_05B, "seed": seed, "tokenizer": tokenizer_dir.name}, sort_keys=True)
    models = (Path(cache_dir) if cache_dir else default_cache_root()) / "models"
    target = models / f"qwen2.5-0.5b-shape-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    return build_once(target, lambda tmp: _build(tmp, tokenizer_dir, seed))


def _build(out: Path, tokenizer_dir: Path, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(
        **QWEN25_05B,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16 directly: half the memory and time of fp32
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and not (out / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {n / 1e6:.0f}M parameters into {out}", file=sys.stderr)


def main(argv: list[str], prog: str) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=raw)
    parser.parse_args(argv)
    print(ensure_qwen05b_shape())
