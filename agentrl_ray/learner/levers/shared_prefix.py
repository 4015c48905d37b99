"""`learner.shared_prefix`: the tokens that every row of a micro-batch begins with (a group's prompt; a task's system
prompt and tool schemas) run through the decoder layers once, not once per row.

A micro-batch of B right-padded rows of T tokens whose first P tokens are the same in every row is packed into one
row of P + B*(T - P) tokens: the prefix, then each row's remainder, with the position ids each token has in its own
row. Every layer but attention works token by token, so it computes exactly the rows' values; attention runs as two
SDPA calls (`attention`): the prefix causally on itself, and each row's remainder on the prefix plus itself
(causally), its keys and values the prefix's, expanded to the B rows, and its own. `unpack` lays the last hidden
states out as the (B, T, H) the head expects, the prefix's expanded to every row, so log-probs, masks and losses
are those of the unpacked batch; backward sums the rows' gradients into the prefix's activations.

The numbers are the rows' own up to floating-point rounding (the matmuls see other shapes). What it saves is
(B - 1) * P tokens of every layer's work per micro-batch: at the 0.5B side-by-side's shape (58-token prompts, 256
sampled tokens, 4 rows) 14% of the tokens; with a 1,000-token prompt of tool schemas and 300 sampled tokens, 8
rows: 67%. Models whose attention goes through Hugging Face's attention interface and whose layers all attend
causally over the whole sequence (no sliding-window or chunked layers) can share; others run unpacked.
"""

from __future__ import annotations

import torch

from agentrl_ray.learner.levers import cpu_attention

ATTENTION = "agentrl_shared_prefix"  # the attention implementation name `install` registers
KWARG = "agentrl_prefix_layout"  # the forward's keyword that carries the layout to every attention call
MIN_SHARED_TOKENS = 16  # below (B - 1) * P saved tokens the packed path is not taken
# On a CPU the remainders attend through `cpu_attention` (GEMMs), not SDPA's flash kernel (docs/benchmarks.md).
CPU_GEMM_ATTENTION = True


def common_prefix_length(input_ids: torch.Tensor) -> int:
    """How many leading tokens every row of `input_ids` (B, T) has in common, at most T - 1 (every row keeps at least
    one token of its own)."""
    same = (input_ids == input_ids[:1]).all(dim=0)  # (T,)
    return min(int(same.long().cumprod(0).sum()), input_ids.shape[1] - 1)


def worth_sharing(rows: int, prefix: int) -> bool:
    return rows > 1 and prefix > 0 and (rows - 1) * prefix >= MIN_SHARED_TOKENS


def pack(input_ids: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) rows sharing their first `prefix` tokens → the packed ids (1, P + B*C), their position ids (1, P + B*C)
    and the layout (B, C, P + C) bool, one (C, P + C) matrix expanded over the rows (a view): which keys (the
    prefix, then the row's own tokens) each of a row's C remaining tokens attends to. Its shape carries B, C and P
    into the compiled layers as sizes, not constants; B as a size of its own, so that the packed length is
    P + B*C to the compiler (derived from the length as (L - P) // C, the layer graph's indices went through a floor
    division, and a cold compile of the packed graphs took ~20% longer on a CPU, inductor simplifying them)."""
    b, t = input_ids.shape
    c = t - prefix
    device = input_ids.device
    ids = torch.cat([input_ids[0, :prefix], input_ids[:, prefix:].reshape(-1)])[None]
    positions = torch.arange(t, device=device)
    position_ids = torch.cat([positions[:prefix], positions[prefix:].repeat(b)])[None]
    own = torch.ones(c, c, dtype=torch.bool, device=device).tril()
    layout = torch.cat([torch.ones(c, prefix, dtype=torch.bool, device=device), own], dim=1)
    return ids, position_ids, layout.expand(b, c, t)


def unpack(hidden: torch.Tensor, rows: int, prefix: int) -> torch.Tensor:
    """Packed hidden states (1, P + B*C, H) → (B, P + C, H), the prefix's repeated in every row."""
    width = hidden.shape[-1]
    shared = hidden[:, :prefix].expand(rows, prefix, width)
    return torch.cat([shared, hidden[0, prefix:].reshape(rows, -1, width)], dim=1)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Hugging Face's SDPA attention, or with `KWARG`'s layout the packed micro-batch's (module docstring).
    query (1, Hq, L, D), key and value (1, Hkv, L, D) → (1, L, Hq, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = kwargs.pop(KWARG, None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    rows, c = layout.shape[0], layout.shape[1]
    p = layout.shape[2] - c
    layout = layout[0]  # (C, P + C): the same for every row
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
    gqa = heads != kv_heads

    def remainder(x: torch.Tensor, n: int) -> torch.Tensor:  # (1, n, B*C, D) → (B, n, C, D)
        return x[:, :, p:].reshape(n, rows, c, dim).transpose(0, 1)

    def with_prefix(x: torch.Tensor) -> torch.Tensor:  # (B, Hkv, P + C, D)
        return torch.cat([x[:, :, :p].expand(rows, kv_heads, p, dim), remainder(x, kv_heads)], dim=2)

    sdpa = torch.nn.functional.scaled_dot_product_attention
    qp, kp, vp = query[:, :, :p], key[:, :, :p], value[:, :, :p]
    head = sdpa(qp, kp, vp, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa)
    q, k, v = remainder(query, heads), with_prefix(key), with_prefix(value)
    if CPU_GEMM_ATTENTION and query.device.type == "cpu" and not dropout:
        tail = cpu_attention.attend(q, k, v, layout, scaling or dim**-0.5)
    else:
        tail = sdpa(q, k, v, attn_mask=layout, dropout_p=dropout, scale=scaling, enable_gqa=gqa)  # (B, Hq, C, D)
    tail = tail.transpose(0, 1).reshape(1, heads, rows * c, dim)
    return torch.cat([head, tail], dim=2).transpose(1, 2).contiguous(), None


def supported(model) -> bool:
    """A Hugging Face model whose layers all attend causally over the whole sequence, through the attention
    interface (`config._attn_implementation` "sdpa", the learner's default)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", ATTENTION):
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return set(layer_types) == {"full_attention"} and not getattr(config, "use_sliding_window", False)


def install(model) -> bool:
    """Register the attention (and SDPA's mask builder under its name) and switch `model` to it; False (nothing
    changed) where the model cannot share (`supported`)."""
    if not supported(model):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
    return True
