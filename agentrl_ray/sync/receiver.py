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

import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from agentrl_ray.sync.collective import CollectiveBackend, CollectiveGroup
from agentrl_ray.sync.ipc import received_tensors
from agentrl_ray.sync.lora import merged_stream, write_peft_adapter
from agentrl_ray.sync.packing import unpack
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
