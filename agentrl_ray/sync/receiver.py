"""The engine side of weight sync: what a rollout worker does with a `types.WeightUpdate` from `sync.sender`.

The receiver turns an update into Hugging Face named tensors and hands them to the engine's in-place load (`load`,
which the rollout worker supplies from its engine, `rollout/engine.py`: vLLM's `reload_weights` then a prefix-cache
reset, or the torch backend's copy into its tensors):
- full weights from the object store: zero-copy views of the packed buffer;
- full weights from the collective group: tensors streamed bucket by bucket into the reload;
- full weights (or an adapter) by CUDA IPC from learner rank 0 on the same GPU: each bucket opened in place as the
  reload reaches it (`sync/ipc.py`);
- a LoRA adapter: merged into the base weights read from the model folder (W = W0 + scaling * B @ A), every tensor
  of the model, because vLLM's in-place reload does not keep the previous values of tensors left out of a reload.
  Only the adapter travels, and the engine keeps no copy of the base: the folder is read again one tensor at a time
  as the reload consumes it (~0.5 s per GB from the page cache), so the merge adds one tensor to the engine's memory
  instead of a second model (at the 0.5B shape in bfloat16 the copy and the merged list were ~2 GiB of the engine's
  peak, docs/benchmarks.md).
- a LoRA adapter to an engine with native LoRA (`load_adapter` given, see `engine_modes`): written as a PEFT folder
  (adapter_config.json + adapter_model.safetensors) on this node and handed to the engine, which serves it as a new
  LoRARequest; no copy of the base weights, no merge. The previous version's folder is removed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from agentrl_ray.sync.collective import CollectiveBackend, CollectiveGroup
from agentrl_ray.sync.ipc import received_tensors
from agentrl_ray.sync.packing import load_safetensors_folder, safetensors_names, stream_safetensors, unpack
from agentrl_ray.types import WeightUpdate

Load = Callable[[Iterable[tuple[str, torch.Tensor]]], None]


class WeightReceiver:
    def __init__(
        self, model_path: str, load: Load, backend: CollectiveBackend, load_adapter: Callable[[str], None] | None = None
    ) -> None:
        self.model_path = model_path
        self.load = load
        self.load_adapter = load_adapter  # native LoRA: the engine takes a PEFT folder
        self._adapter_dir: Path | None = None
        self.backend = backend  # collective_backend(cfg), chosen by the same function as the sender's
        self.version = 0
        self._group: CollectiveGroup | None = None

    def join_group(self, master_addr: str, port: int, world_size: int, rank: int, backend: CollectiveBackend) -> None:
        if backend != self.backend:
            raise RuntimeError(
                f"weight sync: the learner broadcasts over {backend} but this engine expects {self.backend}: "
                "both ends must take collective_backend(cfg) from the same config"
            )
        self._group = CollectiveGroup(master_addr, port, world_size, rank, self.backend)

    async def receive(self, update: WeightUpdate) -> int:
        """Apply `update`; returns its version. Ray does not resolve a reference nested in an argument: it is
        awaited here."""
        if update.collective:
            if self._group is None:
                raise RuntimeError("weight sync: a collective update arrived before join_group")
            stream = self._group.receive(update)
            try:
                self.load(stream)
            finally:
                for _ in stream:  # the broadcasts must all happen, whatever the loader took
                    pass
        else:
            if update.transport == "ipc":  # buffers on the learner's GPU, opened here in place
                named = received_tensors(update)
            else:
                named = unpack(update.tensors, await update.payload)
            if update.kind == "full":
                self.load(named)
            else:
                # The adapter is small, and merging reads the base from the model folder on the CPU.
                adapter = {name: tensor.cpu() for name, tensor in named}
                if self.load_adapter is not None:
                    self._load_native(adapter, update.lora_scaling, update.version)
                else:
                    self.load(merged_stream(self.model_path, adapter, update.lora_scaling))
        self.version = update.version
        return update.version

    def _load_native(self, adapter: dict[str, torch.Tensor], scaling: float, version: int) -> None:
        previous = self._adapter_dir
        self._adapter_dir = Path(tempfile.mkdtemp(prefix=f"agentrl-adapter-v{version}-"))
        write_peft_adapter(self._adapter_dir, adapter, scaling, self.model_path)
        self.load_adapter(str(self._adapter_dir))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)


def base_weights(model_path: str | Path) -> dict[str, torch.Tensor]:
    """A model folder's weights as the engine's reload wants them."""
    weights = load_safetensors_folder(model_path)
    # Tied embeddings are saved once; vLLM's reload still expects lm_head.weight (state_dict() has both).
    if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


def merge_lora(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scaling: float):
    """W = W0 + scaling * B @ A for every adapted weight, in float32, stored in W0's dtype. `adapter` is named like
    the sync payload (`model.layers.0.self_attn.q_proj.lora_A`). What `checkpoints.write_merged` uses; the engines
    apply the same `_merged` one tensor at a time (`merged_stream`), so a merged export holds bit for bit the weights
    the engines sampled with."""
    pairs = _adapter_pairs(adapter, base)
    merged = dict(base)
    for name, (a, b) in pairs.items():
        merged[name] = _merged(base[name], a, b, scaling)
    return merged


def merged_stream(
    model_path: str | Path, adapter: dict[str, torch.Tensor], scaling: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """`merge_lora(base_weights(model_path), adapter, scaling)` as a stream: the folder's tensors one at a time, each
    adapted one merged, lm_head.weight last where the embeddings are tied. Every adapted weight is checked against
    the folder before the first tensor goes out, so a mismatched adapter fails before a reload has begun."""
    files = safetensors_names(model_path)
    pairs = _adapter_pairs(adapter, files)
    tied = "lm_head.weight" not in files and "model.embed_tokens.weight" in files

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in stream_safetensors(files):
            if name in pairs:
                tensor = _merged(tensor, *pairs[name], scaling)  # and the base's view is dropped
            yield name, tensor
        if tied:  # saved once; vLLM's reload still expects lm_head.weight
            for _, embed in stream_safetensors({"model.embed_tokens.weight": files["model.embed_tokens.weight"]}):
                yield "lm_head.weight", embed

    return stream()


def _adapter_pairs(adapter: dict[str, torch.Tensor], base_names) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{base weight name: (lora_A, lora_B)}; a clear error for an adapter that does not fit the base."""
    pairs = {}
    for name, a in adapter.items():
        if not name.endswith(".lora_A"):
            continue
        prefix = name.removesuffix(".lora_A")
        if prefix + ".lora_B" not in adapter:
            raise ValueError(f"weight sync: LoRA update has {name} but no {prefix}.lora_B")
        if prefix + ".weight" not in base_names:
            raise ValueError(f"weight sync: LoRA update adapts {prefix}.weight, which the base model does not have")
        pairs[prefix + ".weight"] = (a, adapter[prefix + ".lora_B"])
    return pairs


def _merged(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    # One fused multiply-add into the float32 copy of W0: no second (out, in) float32 temporary for B @ A
    # (0.25 s against 0.5-0.8 s per merge at the 0.5B shape, the same bits).
    return torch.addmm(w0.float(), b.float(), a.float(), alpha=scaling).to(w0.dtype)


def write_peft_adapter(folder: Path, adapter: dict[str, torch.Tensor], scaling: float, base_model: str) -> None:
    """The sync payload (`model.layers.0.self_attn.q_proj.lora_A`, ...) as a PEFT adapter folder that vLLM loads:
    PEFT's tensor names and a config whose lora_alpha / r is the learner's scaling."""
    tensors = {f"base_model.model.{name}.weight": t.contiguous() for name, t in adapter.items()}
    a_tensors = [t for name, t in adapter.items() if name.endswith(".lora_A")]
    if not a_tensors:
        raise ValueError("weight sync: a LoRA update without any lora_A tensor")
    rank = int(a_tensors[0].shape[0])  # lora_A: (r, in_features)
    modules = sorted({name.removesuffix(".lora_A").rsplit(".", 1)[-1] for name in adapter if name.endswith(".lora_A")})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": scaling * rank,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "fan_in_fan_out": False,
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
