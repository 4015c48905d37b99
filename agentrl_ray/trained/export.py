"""`agentrl-ray export CHECKPOINT --format merged|lora|gguf [--quant q8_0] [--out DIR]`: a trained model to use.

    agentrl-ray export runs/calculator --format merged          # a Hugging Face folder (LoRA merged into its base)
    agentrl-ray export runs/calculator --format lora            # the PEFT adapter, pointing at its base model
    agentrl-ray export runs/calculator --format gguf --quant q8_0   # model-q8_0.gguf + an Ollama Modelfile
    ollama create calculator -f runs/calculator/export-gguf/Modelfile

`merged` loads in `transformers` and vLLM as is; for a LoRA run it holds the weights the rollout engines sampled
with (the same merge, `sync.lora.merge_lora`). `gguf` converts the merged model with llama.cpp's own converter
(`gguf_convert`) and writes a Modelfile with the chat template in Ollama's template language, the run's tools
listed as in training, the stop tokens and the run's sampling parameters.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl_ray.config import ConfigError

if TYPE_CHECKING:
    from agentrl_ray.trained.checkpoints import Checkpoint

FORMATS = ("merged", "lora", "gguf")


def export(checkpoint: str | Path, fmt: str, out: str | Path | None = None, quant: str = "q8_0") -> Path:
    """Write the export; returns its folder."""
    from agentrl_ray.builtin.resolve import resolve_model
    from agentrl_ray.trained.checkpoints import find_checkpoint, write_merged

    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    ckpt = find_checkpoint(checkpoint)
    cfg = ckpt.config()
    out = Path(out) if out else ckpt.run_dir / f"export-{fmt}"
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} already exists and is not empty: choose another --out")
    base = resolve_model(cfg.model.path)
    if fmt == "merged":
        return write_merged(ckpt, base, out)
    if fmt == "lora":
        return _export_adapter(ckpt, base, out)
    from agentrl_ray.trained.gguf_convert import convert

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrl-merged-") as tmp:
        merged = write_merged(ckpt, base, Path(tmp))
        gguf_file = convert(merged, out / f"model-{quant}.gguf", quant)
    (out / "Modelfile").write_text(_modelfile(ckpt, gguf_file.name))
    return out


def _export_adapter(ckpt: Checkpoint, base: str, out: Path) -> Path:
    if not ckpt.is_lora:
        raise ConfigError(f"{ckpt.path} is a full fine-tune (no adapter/): export it with --format merged")
    shutil.copytree(ckpt.weights, out, dirs_exist_ok=True)
    # The adapter must name a base model that loads anywhere: the resolved folder (or the Hub id the run used).
    conf_path = out / "adapter_config.json"
    conf = json.loads(conf_path.read_text())
    conf["base_model_name_or_path"] = base
    conf_path.write_text(json.dumps(conf, indent=2))
    return out


def _modelfile(ckpt: Checkpoint, gguf_name: str) -> str:
    from transformers import AutoTokenizer

    from agentrl_ray.envs.loading import env_class
    from agentrl_ray.envs.tools import tool_schemas
    from agentrl_ray.trained.gguf_convert import modelfile, ollama_template, tools_block

    cfg = ckpt.config()
    tokenizer = AutoTokenizer.from_pretrained(ckpt.weights)
    tools = tool_schemas(env_class(cfg.env.name, cfg.env.tool_specs()))
    r = cfg.rollout
    return modelfile(
        gguf_name,
        ollama_template(tools_block(tokenizer, tools)),
        system=r.system_prompt,
        temperature=r.eval_temperature,
        num_ctx=r.max_total_tokens,
        num_predict=r.max_tokens_per_turn,
    )


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint_NNNNNN folder, or a run folder (its newest checkpoint)")
    p.add_argument("--format", required=True, choices=FORMATS, dest="fmt")
    p.add_argument("--quant", default="q8_0", help="gguf only: f32, f16, bf16 or q8_0 (default)")
    p.add_argument("--out", help="output folder (default: RUN/export-<format>/)")


def main(args) -> int:
    print(export(args.checkpoint, args.fmt, args.out, args.quant))
    return 0
