"""Seeded sampling, the same in both engines: a request's token is its distribution's inverse CDF at a uniform drawn
from the request's own generator.

A request seeded with `s` takes, at its n-th sampled token, the n-th float64 of `torch.Generator().manual_seed(s)`.
The draw depends on the request alone, never on the batch it shares, so a trajectory redone after a crash
(`rollout/recovery.py`) samples what it sampled before. The two engines also pick the same token from the same
probabilities: the torch engine (`rollout/torch_engine.py`) and vLLM's CPU sampler, which `rollout/vllm_engine.py`
replaces with this one.

One uniform per request, against a Gumbel-max sampler's one random number per vocabulary entry: at 64 sequences x
151,936 tokens, vLLM CPU's `fused_gumbel_argmax` took 21 ms of a 129 ms decode iteration on 2 cores, and this
takes ~7 ms (a softmax, a cumulative sum, a binary search; docs/benchmarks.md).
"""

from __future__ import annotations

import torch


def request_uniforms(generators: dict[int, torch.Generator], batch: int) -> torch.Tensor:
    """(batch,) float64 uniforms in [0, 1): row i from `generators[i]` where it has one (a seeded request), the
    others from the process's default generator. Each seeded generator advances by one draw."""
    u = torch.rand(batch, dtype=torch.float64) if len(generators) < batch else torch.empty(batch, dtype=torch.float64)
    for i, gen in generators.items():
        u[i] = torch.rand(1, generator=gen, dtype=torch.float64)
    return u


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities, not necessarily normalised, and (B,) uniforms in [0, 1) -> (B,) sampled indices.

    The index is the first whose cumulative sum exceeds u times the total, so an index of probability 0 is never
    picked. On a CPU the cumulative sum accumulates in float64 whatever the dtype, so each boundary is off by at most
    half a float32 ulp."""
    cdf = probs.cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    # Below the total even where u rounds up to 1 in cdf's dtype: the last index of positive probability then wins.
    target = torch.minimum(uniforms.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(1)  # (B,)
