"""The tokenizer of a resolved model folder; a folder the project made loads without `AutoTokenizer`'s imports.

`from transformers import AutoTokenizer` imports transformers' auto-configuration, which pulls torch, dynamo and the
distributed tensors: 10.8 CPU-seconds measured alone on a 2-core Xeon, paid by the driver (the preflight) and by
every torch-backend engine at each start, where the tokenizer class itself imports in ~2 s. A folder the project
made (the shipped and built-in models, the real models and GGUF files converted into the model cache) was written by
`save_pretrained` of the tokenizer `AutoTokenizer` loaded, so its `tokenizer_config.json` names the class
`AutoTokenizer` returns for it (tests/unit/test_tokenizer_load.py checks each); that class is loaded directly. Any
other folder (a user's, a Hub snapshot, a checkpoint) goes through `AutoTokenizer` and its per-model-type rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl_ray.builtin.cache import SHIPPED, default_cache_root


def _ours(folder: Path) -> bool:
    return any(folder.is_relative_to(root) for root in (SHIPPED, default_cache_root().resolve() / "models"))


def recorded_class(model_path: str) -> str | None:
    """The tokenizer class a project-made folder records, or None where `AutoTokenizer` must decide."""
    folder = Path(model_path).resolve()
    config = folder / "tokenizer_config.json"
    if not _ours(folder) or not config.is_file() or not (folder / "tokenizer.json").is_file():
        return None
    name = json.loads(config.read_text()).get("tokenizer_class")
    return name if isinstance(name, str) and name.isidentifier() else None


def load_tokenizer(model_path: str) -> Any:
    name = recorded_class(model_path)
    if name is not None:
        import transformers

        cls = getattr(transformers, name, None)  # transformers' lazy module imports only that class's file
        if cls is not None:
            return cls.from_pretrained(model_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
