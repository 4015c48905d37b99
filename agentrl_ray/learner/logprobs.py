"""Per-token log-probabilities (and entropy) from a model's full logits, in float32 whatever the logits' dtype, chunk
by chunk, with a backward that keeps no float32 copy of the logits. The learner's default path skips the full logits
altogether (`levers/chunked_logprobs.py`, from the last hidden states); this one serves `learner.chunked_logprobs=false`
and ZeRO-3, and is the reference the chunked path is tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 24  # vocabulary-sized float32 temporaries are at most this many elements (64 MiB)


def _chunks(logits: Tensor):
    """(b, t0, t1) spans covering logits (B, T, V): contiguous views of at most CHUNK_ELEMENTS elements."""
    bsz, seqlen, vocab = logits.shape
    step = max(1, CHUNK_ELEMENTS // vocab)
    for b in range(bsz):
        for t0 in range(0, seqlen, step):
            yield b, t0, min(seqlen, t0 + step)


def _upcast(x: Tensor, temperature: float) -> Tensor:
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # float32 math (float64 stays float64: gradcheck)
    return x / temperature if temperature != 1.0 else x


class _TokenLogProb(torch.autograd.Function):
    """log softmax(logits / temperature)[target] without keeping any float32 copy of the logits for backward.

    Autograd through `logits.float()` + logsumexp would save a float32 (B, T, V) copy: twice the bf16 logits. Here
    only the logits themselves and the (B, T) log-normalizers are saved; backward recomputes softmax chunk by chunk.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float) -> Tensor:  # (B, T, V), (B, T) → (B, T)
        out = torch.empty(targets.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
        lse = torch.empty_like(out)  # (B, T)
        for b, t0, t1 in _chunks(logits):
            z = _upcast(logits[b, t0:t1], temperature)  # (t, V)
            lse[b, t0:t1] = torch.logsumexp(z, dim=-1)
            out[b, t0:t1] = z.gather(-1, targets[b, t0:t1, None]).squeeze(-1) - lse[b, t0:t1]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # (B, T)
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)  # (B, T, V)
        for b, t0, t1 in _chunks(logits):
            g = grad_out[b, t0:t1, None]  # (t, 1)
            # d logp(y) / dz = onehot(y) - softmax(z); z = logits / temperature
            probs = torch.exp(_upcast(logits[b, t0:t1], ctx.temperature) - lse[b, t0:t1, None])  # (t, V)
            chunk = (-probs * g).scatter_add_(-1, targets[b, t0:t1, None], g)
            grad[b, t0:t1] = chunk / ctx.temperature
        return grad, None, None


def token_logprobs_and_entropy(
    logits: Tensor, input_ids: Tensor, with_entropy: bool = True, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor | None]:
    """Per-token log p(input_ids[:, t] | input_ids[:, :t]) and the entropy of that distribution, aligned to input_ids.

    Position 0 has no prediction and gets 0. Math is float32 whatever the logits' dtype, in chunks of positions
    (gather - logsumexp, never a log_softmax of the batch), and backward keeps no float32 copy of the logits.
    `temperature` divides the logits, to score tokens under the distribution the rollout engine sampled from.
    The entropy is for monitoring: it is computed without gradient.
    """
    bsz, seqlen = input_ids.shape
    shifted = logits[:, :-1]  # (B, T-1, V): position t predicts token t + 1
    logprobs = _TokenLogProb.apply(shifted, input_ids[:, 1:], temperature)  # (B, T-1)
    first = logprobs.new_zeros((bsz, 1))  # (B, 1): token 0 has no prediction
    entropy = None
    if with_entropy:
        entropy = logprobs.new_zeros((bsz, seqlen))  # (B, T)
        with torch.no_grad():
            for b, t0, t1 in _chunks(shifted):
                logp = torch.log_softmax(_upcast(shifted[b, t0:t1], temperature), dim=-1)  # (t, V)
                entropy[b, t0 + 1 : t1 + 1] = -(logp.exp() * logp).sum(-1)
    return torch.cat([first, logprobs], dim=1), entropy  # (B, T)
