"""Named tensors ⇄ one flat byte buffer, for the object-store weight sync.

A list of torch tensors goes through Ray's object store by pickling each tensor's storage; one NumPy byte array goes
in with a single copy and comes out on the reader's side as a zero-copy view of shared memory. So the learner packs
its state dict into one buffer (one copy), the rollout worker unpacks views into it (no copy) and vLLM's loader
copies them into its parameters. Each tensor starts at a 64-byte aligned offset so any dtype can be viewed in place.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

ALIGN = 64
Meta = list[tuple[str, str, tuple[int, ...], int, int]]  # (name, dtype, shape, byte offset, byte length)


def pack(named: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> tuple[Meta, np.ndarray]:
    """One uint8 buffer holding every tensor (cast to `dtype` if given, floating-point tensors only)."""
    meta: Meta = []
    offset = 0
    tensors = []
    for name, t in named:
        t = t.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        meta.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        tensors.append(t)
        offset += -(-nbytes // ALIGN) * ALIGN
    buf = torch.empty(offset, dtype=torch.uint8)
    for (_, _, _, start, nbytes), t in zip(meta, tensors):
        if nbytes:
            buf[start : start + nbytes] = t.reshape(-1).view(torch.uint8)
    return meta, buf.numpy()


def unpack(meta: Meta, buf: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensors viewing `buf` (no copy). The views are read-only memory when `buf` came from the object store:
    read them (vLLM's loader copies them into its own parameters), never write to them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        flat = torch.from_numpy(np.asarray(buf, dtype=np.uint8))
    out = []
    for name, dtype, shape, start, nbytes in meta:
        out.append((name, flat[start : start + nbytes].view(getattr(torch, dtype)).view(shape)))
    return out
