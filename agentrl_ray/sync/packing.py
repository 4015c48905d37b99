"""Named tensors ⇄ one flat byte buffer, for the object-store weight sync; a safetensors folder → named tensors (all at
once, or streamed one at a time).

A list of torch tensors goes through Ray's object store by pickling each tensor's storage; one NumPy byte array goes
in with a single copy and comes out on the reader's side as a zero-copy view of shared memory. So the learner packs
its state dict into one buffer (one copy), the rollout worker unpacks views into it (no copy) and vLLM's loader
copies them into its parameters. Each tensor starts at a 64-byte aligned offset so any dtype can be viewed in place.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl_ray.types import TensorMeta

ALIGN = 64


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack(
    named: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> tuple[list[TensorMeta], np.ndarray]:
    """One uint8 buffer holding every tensor (cast to `dtype` if given, floating-point tensors only)."""
    meta: list[TensorMeta] = []
    offset = 0
    tensors = []
    for name, t in named:
        t = t.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        meta.append(TensorMeta(name, dtype_name(t.dtype), tuple(t.shape), offset, nbytes))
        tensors.append(t)
        offset += -(-nbytes // ALIGN) * ALIGN
    buf = torch.empty(offset, dtype=torch.uint8)
    for m, t in zip(meta, tensors):
        if m.nbytes:
            buf[m.offset : m.offset + m.nbytes] = t.reshape(-1).view(torch.uint8)
    return meta, buf.numpy()


def unpack(meta: list[TensorMeta], buf: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensors viewing `buf` (no copy). The views are read-only memory when `buf` came from the object store:
    read them (vLLM's loader copies them into its own parameters), never write to them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        flat = torch.from_numpy(np.asarray(buf, dtype=np.uint8))
    return [(m.name, flat[m.offset : m.offset + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape)) for m in meta]


def load_safetensors_folder(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the `*.safetensors` files of a Hugging Face model folder (sharded or not)."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return weights


def safetensors_names(folder: str | Path) -> dict[str, Path]:
    """Every tensor name of the `*.safetensors` files of a model folder, with the file that holds it (headers only)."""
    from safetensors import safe_open

    names: dict[str, Path] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as handle:
            names.update(dict.fromkeys(handle.keys(), f))
    return names


def stream_safetensors(files: dict[str, Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `files` (name -> file, as `safetensors_names` gives) one at a time.

    A tensor from safetensors is a view of its file's memory mapping, and every page read through a mapping stays
    resident while the mapping lives: reading a 1 GB folder through one open handle keeps the process 1 GB larger
    until the handle goes. Here each tensor comes from its own handle, so only the pages of the tensors the caller
    still holds are mapped; dropping a tensor unmaps them. Treat the tensors as read-only."""
    from safetensors import safe_open

    for name, f in files.items():
        with safe_open(str(f), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        yield name, tensor
