"""GGUF conversion with llama.cpp's own converter, and the Ollama Modelfile that goes with the file.

The converter (`convert_hf_to_gguf.py`, its `conversion/` package and the `gguf-py` it is written against) is not
published on PyPI by itself; the llama-cpp-python source distribution vendors llama.cpp with it. `ensure_converter`
fetches that sdist once with pip (`pip download --no-binary`, nothing is compiled) and keeps only those files under
`$AGENTRL_CACHE/llama.cpp-<version>/`. The conversion runs in a subprocess so that the converter's own gguf-py never
meets the PyPI `gguf` package that `transformers` reads GGUF files with.

One adjustment: llama.cpp names a BPE pre-tokenizer by hashing the ids its tokenizer gives a fixed text, so any
tokenizer with its own vocabulary (the built-in model's) is "not recognized" even when its pre-tokenizer is a known
one. When the hash is unknown and the pre-tokenizer is Qwen2's (what the built-in model uses), the file is marked
"qwen2"; any other unknown tokenizer still fails with the converter's message.

Quantizations: what the converter writes itself (f32, f16, bf16, q8_0). k-quants need llama.cpp's compiled
`llama-quantize`, which is not built here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp converter we run
QUANTS = ("f32", "f16", "bf16", "q8_0")
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

_RUN = r"""
import sys
from pathlib import Path
here = Path(sys.argv[1])
sys.path[:0] = [str(here), str(here / "gguf-py")]
import gguf, torch
from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

src, out, outtype = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
cls = get_model_class(get_model_architecture(ModelBase.load_hparams(src, False), ModelType.TEXT))

def is_qwen2_pretokenizer(tokenizer):
    from transformers import Qwen2Tokenizer
    mine = tokenizer.backend_tokenizer.pre_tokenizer.__getstate__()
    return mine == Qwen2Tokenizer().backend_tokenizer.pre_tokenizer.__getstate__()

class Converter(cls):
    model_arch = cls.model_arch

    def get_vocab_base_pre(self, tokenizer):
        try:
            return super().get_vocab_base_pre(tokenizer)
        except NotImplementedError:
            if is_qwen2_pretokenizer(tokenizer):
                return "qwen2"
            raise

ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
         "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
with torch.inference_mode():
    Converter(src, ftype, out).write()
"""


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", "~/.cache/agentrl_ray")).expanduser()


def ensure_converter() -> Path:
    """The folder holding llama.cpp's converter, fetched on first use."""
    target = cache_root() / f"llama.cpp-{LLAMA_CPP_PYTHON}"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        cmd += ["-d", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not fetch llama.cpp's GGUF converter ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        (sdist,) = Path(tmp).glob("*.tar.gz")
        staged = Path(tmp) / "llama.cpp"
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        # Python < 3.11.4 (e.g. Debian's 3.11.2) has no extraction filters: there the checks here stand alone
        # (regular files and folders only, relative names without "..").
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.removeprefix(prefix)
                wanted = member.name.startswith(prefix) and rel.startswith(_KEEP)
                inside = not Path(rel).is_absolute() and ".." not in Path(rel).parts
                plain = (member.isfile() or member.isdir()) and inside
                if wanted and plain:
                    member.name = rel
                    tar.extract(member, staged, **safe)
        if not (staged / "convert_hf_to_gguf.py").is_file():
            raise RuntimeError(f"{sdist.name} has no vendor/llama.cpp/convert_hf_to_gguf.py")
        try:
            staged.rename(target)  # whole or not at all
        except OSError:
            if not (target / "convert_hf_to_gguf.py").is_file():  # else another process fetched it meanwhile
                raise
    return target


def convert(model_dir: Path, out: Path, quant: str) -> Path:
    """`model_dir` (a Hugging Face folder) → one GGUF file at `out`."""
    if quant not in QUANTS:
        raise ValueError(f"--quant {quant!r}: llama.cpp's converter writes {', '.join(QUANTS)}")
    converter = ensure_converter()
    cmd = [sys.executable, "-c", _RUN, str(converter), str(model_dir), str(out), quant]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "NO_LOCAL_GGUF": "1"})
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"GGUF conversion of {model_dir} failed:\n{done.stderr[-3000:]}")
    return out


# ---------------------------------------------------------------- Ollama


def ollama_template(tools_block: str) -> str:
    """Our chat format (Qwen2.5 / hermes layout, `chat_format`) as an Ollama Go template.

    The tools are listed the way the model saw them in training (`tools_block`, rendered by the model's own chat
    template): Go templates cannot reproduce the listing (first line of each description, parameters in
    declaration order), and the agent's tools are those of its environment. Tool calls are written as
    `<tool_call>` JSON blocks, which is also how Ollama recognises them in the model's output.
    """
    tools_block = tools_block.replace("{{", '{{ "{{" }}')  # literal text: never an action
    # No whitespace trimming ({{- ... -}}) anywhere: every newline below is one the chat format has.
    return (
        "{{ if or .System .Tools }}<|im_start|>system\n{{ if .System }}{{ .System }}{{ end }}"
        "{{ if .Tools }}{{ if .System }}\n{{ end }}" + tools_block + "{{ end }}<|im_end|>\n{{ end }}"
        '{{ $prev := "" }}'
        "{{ range $i, $m := .Messages }}"
        '{{ $rest := slice $.Messages $i }}{{ $next := "" }}'
        "{{ if gt (len $rest) 1 }}{{ $next = (index $rest 1).Role }}{{ end }}"
        '{{ if eq $m.Role "user" }}<|im_start|>user\n{{ $m.Content }}<|im_end|>\n'
        '{{ else if eq $m.Role "assistant" }}<|im_start|>assistant\n{{ $m.Content }}'
        "{{ range $j, $c := $m.ToolCalls }}{{ if or $m.Content $j }}\n{{ end }}"
        '<tool_call>\n{"name": "{{ $c.Function.Name }}", "arguments": {{ json $c.Function.Arguments }}}\n</tool_call>'
        "{{ end }}<|im_end|>\n"
        '{{ else if eq $m.Role "tool" }}{{ if ne $prev "tool" }}<|im_start|>user{{ end }}'
        "\n<tool_response>\n{{ $m.Content }}\n</tool_response>"
        '{{ if ne $next "tool" }}<|im_end|>\n{{ end }}'
        "{{ end }}{{ $prev = $m.Role }}"
        "{{ end }}<|im_start|>assistant\n"
    )


def tools_block(tokenizer, tools: list[dict]) -> str:
    """The tools part of the system turn exactly as the model's chat template renders it."""
    if not tools:
        return ""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "-"}], tools=tools, tokenize=False)
    start = text.index("<|im_start|>system\n") + len("<|im_start|>system\n")
    return text[start : text.index("<|im_end|>", start)]


def modelfile(gguf_name: str, template: str, *, system: str, temperature: float, num_ctx: int, num_predict: int):
    """An Ollama Modelfile for `gguf_name` (a file in the same folder)."""
    lines = [
        f"FROM ./{gguf_name}",
        f'TEMPLATE """{template}"""',
        'PARAMETER stop "<|im_end|>"',
        'PARAMETER stop "<|endoftext|>"',
        f"PARAMETER temperature {temperature:g}",
        f"PARAMETER num_ctx {num_ctx}",
        f"PARAMETER num_predict {num_predict}",
    ]
    if system:
        lines.append(f"SYSTEM {json.dumps(system)}")
    return "\n".join(lines) + "\n"
