"""Masked attention for a CPU learner as five matmuls and two softmax passes, one opaque op for `torch.compile`.

At the learner's shapes on a CPU (a micro-batch's rows of a few hundred tokens, head size 64, a few key/value
heads shared by groups of query heads) SDPA's CPU flash kernel reaches ~15% of the machine's bfloat16 GEMM rate:
its tiles are too small to keep the cores' matrix units fed. Written out, with the query heads of one key/value
head stacked into one matrix (GQA), attention is a few large GEMMs, which mkldnn runs near peak, and row-wise passes
that are memory-bound:

- forward: S = (Q * scale) K^T, masked; P = softmax(S) (float32 inside, stored bfloat16); O = P V;
- backward: dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)) (softmax's own backward); dQ = dS K;
  dK = dS^T Q (the scale folded into Q and dQ).

The scores come out of the GEMM in the inputs' dtype (CPU matmuls have no float32 output for bfloat16 inputs), as in
Hugging Face's eager attention; the softmax runs in float32. P is kept for the backward: B * Hq * C * L elements a
layer call (~9 MB at 4 rows of 256 tokens on 314 keys), where flash keeps one log-sum-exp per row.

The forward and the backward are custom ops, so inductor calls them as they are inside a compiled layer instead of
lowering (and re-fusing) their softmax: round 10 of issue 33 found the written-out attention lost its gain in the
compiled layer that way (docs/benchmarks.md).
"""

from __future__ import annotations

import torch

NAMESPACE = "agentrl"


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, Hq, C, D) → (B, Hkv, G*C, D): the G query heads of each key/value head stacked as one matrix."""
    b, h, c, d = x.shape
    return x.reshape(b, kv_heads, (h // kv_heads) * c, d)


@torch.library.custom_op(f"{NAMESPACE}::masked_attention", mutates_args=())
def masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """query (B, Hq, C, D), key and value (B, Hkv, L, D), `allowed` (C, L) bool: which keys each query position
    sees (every row of a query position must see at least one) → the output (B, Hq, C, D) and the probabilities
    (B, Hkv, G*C, L) the backward reads."""
    with torch.autocast("cpu", enabled=False):  # `attend` gave the inputs autocast's dtype
        return _forward(query, key, value, allowed, scale)


def _forward(query, key, value, allowed, scale):
    b, h, c, d = query.shape
    kv = key.shape[1]
    q = _grouped((query * scale).contiguous(), kv)
    scores = torch.matmul(q, key.transpose(-1, -2))  # (B, Hkv, G*C, L)
    bias = torch.zeros(allowed.shape, dtype=scores.dtype, device=scores.device).masked_fill_(~allowed, float("-inf"))
    scores = scores.view(b, kv, h // kv, c, -1).add_(bias)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype).view(b, kv, (h // kv) * c, -1)
    out = torch.matmul(probs, value).view(b, h, c, d)
    return out, probs


@masked_attention.register_fake
def _(query, key, value, allowed, scale):
    b, h, c, d = query.shape
    kv, length = key.shape[1], key.shape[2]
    return torch.empty_like(query, memory_format=torch.contiguous_format), query.new_empty(b, kv, (h // kv) * c, length)


@torch.library.custom_op(f"{NAMESPACE}::masked_attention_backward", mutates_args=())
def masked_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    probs: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.autocast("cpu", enabled=False):
        return _backward_values(grad_out, query, key, value, probs, scale)


def _backward_values(grad_out, query, key, value, probs, scale):
    b, h, c, d = query.shape
    kv = key.shape[1]
    do = _grouped(grad_out.to(query.dtype).contiguous(), kv)
    grad_value = torch.matmul(probs.transpose(-1, -2), do)
    grad_probs = torch.matmul(do, value.transpose(-1, -2))
    grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
    grad_query = torch.matmul(grad_scores, key).mul_(scale).view(b, h, c, d)
    q = _grouped((query * scale).contiguous(), kv)
    grad_key = torch.matmul(grad_scores.transpose(-1, -2), q)
    return grad_query, grad_key, grad_value


@masked_attention_backward.register_fake
def _(grad_out, query, key, value, probs, scale):
    return (
        torch.empty_like(query, memory_format=torch.contiguous_format),
        torch.empty_like(key, memory_format=torch.contiguous_format),
        torch.empty_like(value, memory_format=torch.contiguous_format),
    )


def _setup_context(ctx, inputs, output):
    query, key, value, _, scale = inputs
    ctx.save_for_backward(query, key, value, output[1])
    ctx.scale = scale


def _backward(ctx, grad_out, _grad_probs):
    query, key, value, probs = ctx.saved_tensors
    grad_query, grad_key, grad_value = masked_attention_backward(grad_out, query, key, value, probs, ctx.scale)
    return grad_query, grad_key, grad_value, None, None


masked_attention.register_autograd(_backward, setup_context=_setup_context)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scale: float):
    """`masked_attention`'s output alone (B, Hq, C, D). Under CPU autocast the op computes in autocast's dtype, as
    SDPA does there (a float32 model under `learner.bf16`)."""
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    return masked_attention(query, key, value, allowed, scale)[0]
