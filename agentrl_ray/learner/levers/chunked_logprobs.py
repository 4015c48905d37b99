"""Token log-probabilities straight from the last hidden states, never materialising the (B, T, V) logits.

At a real vocabulary the language-model head dominates the learner's memory: Qwen2.5-0.5B's 151,936 logits per
token are 0.6 MB in float32, so 64 samples of 300 tokens would need 11.7 GB for the logits alone, plus as much for
their gradient. Here the head's matmul runs chunk by chunk over tokens (logits of a chunk, float32 log-softmax,
gather, drop). Backward needs each token's softmax: where the call's (N, V) probabilities fit the device's keep
budget (`keep_bytes_for`: 1 GiB on a CPU, i.e. ~3,500 scored tokens at 152k vocabulary in bfloat16; on a GPU up to
8 GiB, at most a quarter of its free memory) forward keeps them in the head's dtype and backward reads them; beyond
it backward recomputes each chunk's logits, so peak memory is one chunk's (chunk, V) temporaries whatever the batch,
for one extra head matmul and softmax pass (the head is ~1/4 of a 0.5B model's FLOPs).

Only the positions a loss reads are computed (`needed`): a prompt's tokens and padding are in no loss, and at a real
vocabulary the head is ~1/3 of the LoRA learner's arithmetic per token (its matmul forward, again in the recompute and
once more in backward), so a prompt of P tokens in a sequence of T saves that share of P/T of the head.

The result equals `logprobs.token_logprobs_and_entropy(hidden @ weight.T, ...)` up to float rounding, gradients
included, at every needed position, and is 0 elsewhere (`tests/unit/test_chunked_logprobs.py`). Plain torch: the
learner (`learner/policy.py`) calls it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 24  # a chunk's (tokens, V) float32 temporaries are at most this many elements (64 MiB)
# On a GPU memory is plentiful and a 110-token chunk (at 152k vocabulary) starves the head's matmul and launches
# ~10 kernels per chunk: 512 MiB chunks (883 tokens at 152k) keep the matmul large (`benchmarks/run.py learner`).
CUDA_CHUNK_ELEMENTS = 1 << 27
# On a CPU with AMX the head's products are short of the matrix units at 110 tokens (its input gradient, 110 x 152k by
# 152k x 896, ran at 829 GFLOP/s against 1,659 at 512 tokens): there the GPU's chunk made the 0.5B learner's quarter
# step 9-10% faster for 0.1-0.2 GiB more (docs/benchmarks.md, issue 55). Other CPUs keep 110 tokens (below).
AMX_CHUNK_ELEMENTS = CUDA_CHUNK_ELEMENTS
# Forward keeps the (N, V) probabilities for backward when they fit: that saves the recompute's head matmul and
# float32 softmax pass. On a CPU a step -7.3% (docs/benchmarks.md, "The CPU learner's levers"); on an H200 -3 to -4% at
# 0.5B and -2 to -8% at 1.5B (16 x 1,024 tokens: 4.4 GB kept; docs/history/learner_speed.md, round 3). On a GPU the
# budget is also at most CUDA_KEEP_FREE_SHARE of the memory it has free at the call (the driver's free memory and the
# caching allocator's unused blocks), so that a GPU shared with an engine or a large model is not pushed to OOM.
KEEP_BYTES = 1 << 30
CUDA_KEEP_BYTES = 8 << 30
CUDA_KEEP_FREE_SHARE = 0.25


def chunk_tokens_for(vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per chunk so that a chunk's logits hold at most `chunk_elements` elements (at least 16 tokens, so that
    the matmul stays efficient at any vocabulary)."""
    return max(16, chunk_elements // vocab)


def chunk_elements_for(device: torch.device, amx: bool | None = None) -> int:
    """The (tokens, V) temporaries' budget per chunk on `device` (`amx`: whether this CPU has AMX; default: read
    from /proc/cpuinfo). On a CPU without AMX 441-token chunks ran the fused head alone ~8% faster but the learner's
    step no faster (docs/benchmarks.md, "The CPU learner's levers"): 110 stay there."""
    if device.type == "cuda":
        return CUDA_CHUNK_ELEMENTS
    return AMX_CHUNK_ELEMENTS if (_cpu_has_amx() if amx is None else amx) else CHUNK_ELEMENTS


@functools.cache
def _cpu_has_amx() -> bool:
    from agentrl_ray.infra.hardware import this_cpu

    return this_cpu().amx


def keep_bytes_for(device: torch.device) -> int:
    """The most bytes of (N, V) probabilities forward keeps for backward on `device` (beyond: recomputed): KEEP_BYTES
    on a CPU; on a GPU CUDA_KEEP_BYTES or CUDA_KEEP_FREE_SHARE of its free memory now, whichever is smaller."""
    if device.type != "cuda":
        return KEEP_BYTES
    if not CUDA_KEEP_BYTES:
        return 0
    free, _total = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # the allocator's own free blocks
    return min(CUDA_KEEP_BYTES, int((free + unused) * CUDA_KEEP_FREE_SHARE))


def _forward_chunk(
    h: Tensor, w: Tensor, targets: Tensor, temperature: float, acc: torch.dtype, with_entropy: bool, keep: bool
):
    """One chunk's (t,) log p(target), log-normalizer, entropy (zeros(0) without) and, with `keep`, its (t, V)
    probabilities in w's dtype (else zeros(0)): the head's matmul in w's dtype, the softmax math in `acc`."""
    z = _scaled_logits(h, w, acc, temperature)  # (t, V)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    none = lse.new_zeros(0)
    if not (with_entropy or keep):
        return logp, lse, none, none
    p = (z - lse[:, None]).exp_()  # p = exp(z - lse): one (t, V) temporary
    kept = p.to(w.dtype, copy=True) if keep else none  # a copy: p changes in place next
    # H = lse - sum(p * z), in place on p
    return logp, lse, lse - p.mul_(z).sum(-1) if with_entropy else none, kept


def _grad_logits(h: Tensor, w: Tensor, targets: Tensor, lse: Tensor, g: Tensor, temperature: float) -> Tensor:
    """d loss / d (hidden @ w.T) of one chunk, (t, V) in w's dtype, from the upstream (t, 1) gradient `g` of its
    log-probs: d logp(y) / dz = onehot(y) - softmax(z), with z = logits / temperature; in place on the recomputed z."""
    dz = _scaled_logits(h, w, lse.dtype, temperature).sub_(lse[:, None]).exp_().mul_(-g)
    dz.scatter_add_(-1, targets[:, None], g)
    if temperature != 1.0:
        dz.div_(temperature)
    return dz.to(w.dtype)


def _grad_logits_kept(p: Tensor, targets: Tensor, logp: Tensor, g: Tensor, temperature: float) -> Tensor:
    """`_grad_logits` from the kept probabilities `p` (t, V) in the head's dtype, in that dtype: -g * p everywhere,
    and at the target g * (1 - p(y)) taken from the float32 log-prob (a confident token's 1 - p(y) is below the
    head dtype's resolution near 1)."""
    g = g / temperature
    dz = p.mul(-g.to(p.dtype))
    # index_put_, not scatter_: torch's CPU scatter_ on a bfloat16 tensor converts all of it to float32 and back
    # (two (t, V) copies, 7-24 ms a chunk at 152k vocabulary), where this writes the t targets only.
    rows = torch.arange(dz.shape[0], device=dz.device)
    dz[rows, targets] = (g[:, 0] * -torch.expm1(logp)).to(p.dtype)
    return dz


_compiled: dict[str, object] = {}


def _chunk_fns(fused: bool):
    """The two per-chunk functions, eager or (`fused`) each compiled into one region by torch.compile: inductor
    then fuses the (t, V) float32 passes after the matmul (cast, log-sum-exp, gather, entropy; exp, scale, scatter,
    cast) into a few kernels instead of one pass per operation. Dynamic shapes: the last, shorter chunk and every
    batch reuse one graph."""
    if not fused:
        return _forward_chunk, _grad_logits
    if not _compiled:
        _compiled["forward"] = torch.compile(_forward_chunk, dynamic=True)
        _compiled["grad"] = torch.compile(_grad_logits, dynamic=True)
    return _compiled["forward"], _compiled["grad"]


class _HiddenTokenLogProb(torch.autograd.Function):
    """log softmax((hidden @ weight.T) / temperature)[target] and the (no-grad) entropy, for flat tokens.

    Saves hidden (N, H), the weight and the (N,) log-normalizers and log-probs; with `keep` also each chunk's
    probabilities, which backward reads (and drops, chunk by chunk) instead of recomputing the chunk's logits.
    The head matmul runs in `compute_dtype` (bfloat16 under autocast, as the model's own head would), the softmax
    math in float32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, compute_dtype, with_entropy, fused, keep):
        n = hidden.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)  # float32 (float64 stays float64: gradcheck)
        w = weight.to(compute_dtype)  # (V, H): cast once per call (kept for backward), not per chunk
        out = torch.empty(n, dtype=acc, device=hidden.device)  # (N,)
        lse = torch.empty_like(out)
        entropy = torch.zeros_like(out) if with_entropy else out.new_zeros(0)
        forward_chunk, _ = _chunk_fns(fused)
        kept = []
        for t0 in range(0, n, chunk):
            t1 = min(n, t0 + chunk)
            logp, chunk_lse, ent, p = forward_chunk(
                hidden[t0:t1], w, targets[t0:t1], temperature, acc, with_entropy, keep
            )
            out[t0:t1], lse[t0:t1] = logp, chunk_lse
            if with_entropy:
                entropy[t0:t1] = ent
            if keep:
                kept.append(p)
        ctx.save_for_backward(hidden, w, targets, lse, out)
        ctx.kept = kept  # no autograd history: plain tensors, dropped by backward as it goes
        ctx.temperature, ctx.chunk, ctx.weight_dtype, ctx.fused = temperature, chunk, weight.dtype, fused
        # head-gradient rows at once (full fine-tuning): the CPU's budget on any CPU (AMX's chunk is for the head's
        # input gradient, not measured for this product)
        slice_elements = CUDA_CHUNK_ELEMENTS if hidden.device.type == "cuda" else CHUNK_ELEMENTS
        ctx.vocab_slice = max(1, slice_elements // weight.shape[1])
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, _grad_entropy):  # (N,)
        hidden, w, targets, lse, logp = ctx.saved_tensors
        kept, ctx.kept = ctx.kept, None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=lse.dtype, device=w.device) if need_w else None
        _, grad_logits = _chunk_fns(ctx.fused)
        for i, t0 in enumerate(range(0, hidden.shape[0], ctx.chunk)):
            t1 = min(hidden.shape[0], t0 + ctx.chunk)
            h = hidden[t0:t1].to(w.dtype)  # (t, H)
            g = grad_out[t0:t1, None].to(lse.dtype)  # (t, 1)
            if kept:
                p, kept[i] = kept[i], None
                dz = _grad_logits_kept(p, targets[t0:t1], logp[t0:t1], g, ctx.temperature)  # (t, V)
                del p
            else:
                dz = grad_logits(h, w, targets[t0:t1], lse[t0:t1], g, ctx.temperature)  # (t, V)
            if need_h:
                grad_h[t0:t1] = (dz @ w).to(hidden.dtype)
            if need_w:  # the head is trained (full fine-tuning): accumulate in float32 whatever the compute dtype,
                # a slice of the vocabulary at a time: add_ casts as it adds, so the only temporary is one slice's
                # product, not a whole (V, H) one and its float32 copy (at 152k x 896: 0.8 GB less on the GPU)
                for v0 in range(0, w.shape[0], ctx.vocab_slice):
                    v1 = min(w.shape[0], v0 + ctx.vocab_slice)
                    grad_w[v0:v1].add_(dz[:, v0:v1].T @ h)
        grad_w = grad_w.to(ctx.weight_dtype) if need_w else None
        return grad_h, grad_w, None, None, None, None, None, None, None


def _scaled_logits(hidden: Tensor, w: Tensor, acc: torch.dtype, temperature: float) -> Tensor:
    """(t, V) logits / temperature in the accumulation dtype; the matmul in w's dtype (a fresh tensor: may be
    modified in place)."""
    z = torch.nn.functional.linear(hidden.to(w.dtype), w).to(acc)
    return z.div_(temperature) if temperature != 1.0 else z


def hidden_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    input_ids: Tensor,
    with_entropy: bool = True,
    *,
    temperature: float = 1.0,
    chunk: int | None = None,
    compute_dtype: torch.dtype | None = None,
    needed: Tensor | None = None,
    fused: bool = False,
    keep_bytes: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log p(input_ids[:, t] | input_ids[:, :t]) and entropy, (B, T) each, from the last hidden states
    (B, T, H) and the head's weight (V, H); position 0 has no prediction and gets 0 (as token_logprobs_and_entropy).

    `chunk`: tokens per chunk (default: `chunk_tokens_for(V)`). `compute_dtype`: the head matmul's dtype (default:
    the autocast dtype when autocast is on, else the weight's). `needed` (B, T): the positions whose log-prob the
    caller reads (e.g. action or environment tokens); the others are not computed and get 0. `fused`: each chunk's
    softmax math compiled into fused kernels (`torch.compile`, as `learner.compile` asks). `keep_bytes`: forward
    keeps the (n, V) probabilities for backward when they take at most this many bytes (default:
    `keep_bytes_for(device)`; 0: always recompute).
    """
    bsz, seqlen, width = hidden.shape
    if compute_dtype is None:
        on = torch.is_autocast_enabled(hidden.device.type)
        compute_dtype = torch.get_autocast_dtype(hidden.device.type) if on else weight.dtype
    chunk = chunk or chunk_tokens_for(weight.shape[0], chunk_elements_for(hidden.device))
    flat = hidden[:, :-1].reshape(-1, width)  # (B*(T-1), H): position t predicts token t + 1
    targets = input_ids[:, 1:].reshape(-1)
    rows = None
    if needed is not None:
        rows = needed[:, 1:].reshape(-1).nonzero().squeeze(-1)  # (n,) flat positions that are read
        flat, targets = flat.index_select(0, rows), targets.index_select(0, rows)  # (n, H), (n,)
    trains = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if trains and keep_bytes is None:  # only then: on a GPU the budget asks the driver for its free memory
        keep_bytes = keep_bytes_for(hidden.device)
    keep = trains and flat.shape[0] * weight.shape[0] * compute_dtype.itemsize <= keep_bytes
    with torch.autocast(hidden.device.type, enabled=False):  # dtypes are explicit inside
        logp, ent = _HiddenTokenLogProb.apply(
            flat, weight, targets, temperature, chunk, compute_dtype, with_entropy, fused, keep
        )
    if rows is not None:  # back to (B*(T-1),), zeros where nothing was computed
        logp = logp.new_zeros(bsz * (seqlen - 1)).index_copy(0, rows, logp)
        ent = ent.new_zeros(bsz * (seqlen - 1)).index_copy(0, rows, ent) if with_entropy else ent
    first = logp.new_zeros((bsz, 1))
    logprobs = torch.cat([first, logp.view(bsz, seqlen - 1)], dim=1)  # (B, T)
    entropy = torch.cat([first, ent.view(bsz, seqlen - 1)], dim=1) if with_entropy else None
    return logprobs, entropy
