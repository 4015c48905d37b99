"""What a run leaves behind, read back: its checkpoints, its config, and LoRA adapters merged into their base.

A run folder (`Config.run_dir`) holds `config.json` (the resolved config) and `checkpoint_NNNNNN/` folders written
by `learner.policy.Policy.save`: `model/` (a full Hugging Face model with its tokenizer) or `adapter/` (a PEFT
adapter with the tokenizer), plus the trainer state. `agentrl-ray eval`, `chat` and `export` take either folder.

The LoRA merge here is the one the rollout engines apply during training (`sync.lora.merge_lora`), so a merged
checkpoint holds bit for bit the weights the engines sampled with.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl_ray.config import Config, ConfigError, config_from_dict

_CHECKPOINT = re.compile(r"checkpoint_(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # the checkpoint_NNNNNN folder
    run_dir: Path
    step: int

    @property
    def is_lora(self) -> bool:
        return (self.path / "adapter").is_dir()

    @property
    def weights(self) -> Path:
        """The Hugging Face folder inside: `model/` (full) or `adapter/` (LoRA)."""
        return self.path / ("adapter" if self.is_lora else "model")

    def config(self) -> Config:
        """The config the run was trained with (`config.json` of its run folder)."""
        path = self.run_dir / "config.json"
        if not path.is_file():
            raise ConfigError(f"{self.run_dir} has no config.json: not a run folder made by agentrl-ray train")
        return config_from_dict(json.loads(path.read_text()))


def find_checkpoint(path: str | Path) -> Checkpoint:
    """A checkpoint folder, or a run folder (its newest checkpoint)."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"checkpoint {path} does not exist")
    match = _CHECKPOINT.search(path.name)
    if match is None:
        found = sorted((p for p in path.glob("checkpoint_*") if _CHECKPOINT.search(p.name)), key=lambda p: p.name)
        if not found:
            raise ConfigError(f"{path} is neither a checkpoint_NNNNNN folder nor a run folder holding one")
        path, match = found[-1], _CHECKPOINT.search(found[-1].name)
    ckpt = Checkpoint(path, path.parent, int(match.group(1)))
    if not (ckpt.weights / "config.json").is_file() and not (ckpt.weights / "adapter_config.json").is_file():
        raise ConfigError(f"checkpoint {path} holds neither model/ nor adapter/ weights: it is incomplete")
    return ckpt


def load_safetensors(folder: str | Path) -> dict[str, torch.Tensor]:
    from agentrl_ray.sync.packing import load_safetensors_folder

    return load_safetensors_folder(folder)


def read_adapter(folder: Path) -> tuple[dict[str, torch.Tensor], float]:
    """A saved PEFT adapter as (tensors named like the sync payload, scaling = alpha / r)."""
    conf = json.loads((folder / "adapter_config.json").read_text())
    if conf.get("use_rslora") or conf.get("use_dora"):
        raise ConfigError(f"adapter {folder}: rsLoRA/DoRA adapters are not what agentrl-ray trains")
    tensors = {
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight → model.layers.0.self_attn.q_proj.lora_A
        name.removeprefix("base_model.model.").removesuffix(".weight"): t
        for name, t in load_safetensors(folder).items()
    }
    return tensors, conf["lora_alpha"] / conf["r"]


def write_merged(ckpt: Checkpoint, base_model: str, out: Path) -> Path:
    """A full Hugging Face model folder at `out` with the checkpoint's weights (LoRA merged into `base_model`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    if not ckpt.is_lora:
        for f in ckpt.weights.iterdir():
            if f.is_file():
                shutil.copy2(f, out / f.name)
        return out
    adapter, scaling = read_adapter(ckpt.weights)
    from agentrl_ray.sync.lora import base_weights, merge_lora

    merged = merge_lora(base_weights(base_model), adapter, scaling)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=merged["model.embed_tokens.weight"].dtype)
    missing, unexpected = model.load_state_dict(merged, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"adapter {ckpt.weights} does not fit {base_model}: missing {missing}, extra {unexpected}")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(ckpt.weights).save_pretrained(out)  # the tokenizer saved with the checkpoint
    return out
