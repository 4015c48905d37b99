"""`learner.shared_prefix`: a micro-batch's common prefix (a group's prompt) runs through the layers once, packed
with every row's remainder into one row (learner/levers/shared_prefix.py). It must give the unpacked batch's log-probs
and gradients to float rounding, on the learner's real `Policy` (LoRA and full fine-tune, eager and compiled), fall
back where it cannot pack, and `micro_batches` must put a group's rows together only where that computes fewer
tokens."""

from __future__ import annotations

import pytest
import torch
from builders import cpu_policy

from agentrl_ray.learner.batching import computed_tokens, micro_batches
from agentrl_ray.learner.levers import shared_prefix
from agentrl_ray.types import TrainBatch


def _rows(prompt_len: int, lengths: list[int], vocab: int, seed: int = 0, prompts: int = 1) -> torch.Tensor:
    """Right-padded (B, T) ids (pad 0): `prompts` prompts of `prompt_len` tokens, the rows cycling through them, each
    row then its own tokens up to its length."""
    g = torch.Generator().manual_seed(seed)
    heads = [torch.randint(3, vocab, (prompt_len,), generator=g) for _ in range(prompts)]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.cat([heads[i % prompts], torch.randint(3, vocab, (n - prompt_len,), generator=g)])
    return ids


def _policy(path: str, monkeypatch, *overrides: str):
    return cpu_policy(path, monkeypatch, "learner.compile=false", *overrides)


def _logprobs_and_grads(policy, ids: torch.Tensor, share: bool):
    policy.shared_prefix = share
    mask = (ids != 0).long()
    needed = mask.bool().clone()
    needed[:, :6] = False  # the prompt is not scored, its last token's prediction is
    logp, entropy = policy.token_logprobs(ids, mask, needed=needed)
    policy.wrapped.zero_grad(set_to_none=True)
    (-(logp * needed).sum() - 0.1 * (entropy * needed).sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.requires_grad and p.grad is not None}
    return logp.detach() * needed, grads


def _assert_close(policy, ids: torch.Tensor) -> None:
    want_logp, want = _logprobs_and_grads(policy, ids, share=False)
    got_logp, got = _logprobs_and_grads(policy, ids, share=True)
    torch.testing.assert_close(got_logp, want_logp, rtol=1e-5, atol=1e-5)
    assert got.keys() == want.keys() and len(got) > 0
    for name, w in want.items():
        assert (got[name] - w).norm() <= 1e-4 * w.norm() + 1e-7, name


@pytest.mark.parametrize("overrides", [(), ("learner.lora.enabled=true",)], ids=["full", "lora"])
def test_packed_rows_give_the_rows_log_probs_and_gradients(builtin_model_path, monkeypatch, overrides):
    policy = _policy(builtin_model_path, monkeypatch, *overrides)
    assert policy.shared_prefix  # the shipped model attends through SDPA over whole sequences
    vocab = policy.module.config.vocab_size
    ids = _rows(7, [19, 12, 16, 19], vocab)  # a 7-token prompt, right-padded rows of three lengths
    assert shared_prefix.common_prefix_length(ids) == 7
    _assert_close(policy, ids)


def test_packing_is_what_runs_and_counts_each_prefix_token_once(builtin_model_path, monkeypatch):
    """The packed forward is taken: the model sees one row of P + B*(T - P) tokens, not B rows of T."""
    policy = _policy(builtin_model_path, monkeypatch, "learner.lora.enabled=true")
    ids = _rows(10, [30, 30, 30, 30], policy.module.config.vocab_size)
    seen = []
    embed = policy.module.get_input_embeddings()
    handle = embed.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        for share in (False, True):
            policy.shared_prefix = share
            policy.token_logprobs(ids, torch.ones_like(ids))
    finally:
        handle.remove()
    assert seen == [(4, 30), (1, 10 + 4 * 20)]


def test_a_common_prefix_beyond_the_prompt_and_a_left_padded_batch(builtin_model_path, monkeypatch):
    """Rows that also agree on their first sampled tokens share those too (their log-probs are the same in every
    row); a left-padded batch (a mask that is not ones-then-zeros) runs unpacked, with its mask."""
    policy = _policy(builtin_model_path, monkeypatch, "learner.lora.enabled=true")
    ids = _rows(6, [18, 18, 18], policy.module.config.vocab_size)
    ids[:, 6:9] = ids[0, 6:9]
    assert shared_prefix.common_prefix_length(ids) == 9
    _assert_close(policy, ids)
    left = torch.cat([torch.zeros(3, 2, dtype=torch.long), ids[:, :-2]], dim=1)
    left[1, :2] = ids[1, :2]  # row 1 is unpadded, rows 0 and 2 left-padded
    mask = (left != 0).long()
    policy.shared_prefix = True
    packed = policy.token_logprobs(left, mask)[0]
    policy.shared_prefix = False
    plain = policy.token_logprobs(left, mask)[0]
    torch.testing.assert_close(packed, plain, rtol=0, atol=0)


@pytest.mark.long  # minutes of compiling or a benchmark's run: make test-all (docs/testing.md)
def test_compiled_layers_run_the_packed_micro_batch(builtin_model_path, monkeypatch):
    """learner.compile=true (inductor, dynamic shapes) through the packed path, two prompt lengths and row counts
    on one compiled graph: the eager unpacked log-probs and gradients to float rounding."""
    policy = _policy(builtin_model_path, monkeypatch, "learner.lora.enabled=true", "learner.compile=true")
    assert policy.compiled
    vocab = policy.module.config.vocab_size
    for ids in (_rows(7, [20, 15, 20, 18], vocab), _rows(11, [25, 25, 21], vocab, seed=1)):
        _assert_close(policy, ids)


def test_pack_lays_out_the_prefix_then_each_rows_remainder_with_their_own_positions():
    ids = _rows(3, [6, 5, 6], 50)  # a 3-token prompt, rows of 3 + 3 tokens (one right-padded)
    packed, positions, layout = shared_prefix.pack(ids, 3)
    assert packed.tolist() == [ids[0, :3].tolist() + ids[:, 3:].reshape(-1).tolist()]
    assert positions.tolist() == [[0, 1, 2] + [3, 4, 5] * 3]
    # (B, C, P + C): every key of the prefix, then the row's own tokens causally; one matrix, expanded over the rows
    # (the row count reaches the compiled layers as a size of its own, not as (L - P) // C)
    assert layout.shape == (3, 3, 6) and layout.stride(0) == 0
    want = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert all(torch.equal(layout[b], want) for b in range(3))


def test_a_model_with_sliding_window_layers_runs_unpacked(builtin_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(builtin_model_path)
    assert shared_prefix.supported(model)
    model.config.use_sliding_window = True
    assert not shared_prefix.install(model)
    assert model.config._attn_implementation == "sdpa"


def _batch(ids: torch.Tensor) -> TrainBatch:
    b, t = ids.shape
    mask = (ids != 0).long()
    zeros = torch.zeros(b, t)
    return TrainBatch(
        input_ids=ids,
        attention_mask=mask,
        action_mask=mask.float(),
        env_mask=zeros,
        rollout_logprobs=zeros,
        advantages=torch.zeros(b),
        truncated=torch.zeros(b, dtype=torch.bool),
        policy_version=torch.zeros(b, dtype=torch.long),
    )


def test_micro_batches_put_a_groups_rows_together_when_that_computes_fewer_tokens():
    # Two prompts of 40 tokens, rows alternating between them, all 60 long: by length the micro-batches mix the
    # prompts (nothing shared); by tokens each holds one prompt's rows.
    batch = _batch(_rows(40, [60] * 8, 500, prompts=2))
    split = micro_batches(batch, 2, share_prefix=True)
    for mb, _ in split:
        assert shared_prefix.common_prefix_length(mb.input_ids) >= 40
    assert computed_tokens(batch, torch.arange(8), 2) == 8 * 60  # as given: alternating, nothing shared
    assert sum(len(mb) * 60 - (len(mb) - 1) * 40 for mb, _ in split) == 2 * (40 + 4 * 20)
    # Short prompts and lengths far apart: grouping by prompt would pad more than it shares; length order stays.
    lengths = [10, 200, 12, 198, 11, 199, 13, 197]
    batch = _batch(_rows(4, lengths, 500, prompts=2))
    split = micro_batches(batch, 2, share_prefix=True)
    assert [sorted(mb.attention_mask.sum(dim=1).tolist()) for mb, _ in split] == [
        [10, 11, 12, 13],
        [197, 198, 199, 200],
    ]
    # Without share_prefix the order is by length, as before.
    plain = micro_batches(_batch(_rows(40, [60] * 8, 500, prompts=2)), 2)
    assert all(shared_prefix.common_prefix_length(mb.input_ids) == 0 for mb, _ in plain)
