"""`learner.compile_buckets`: each forward right-padded to a multiple of N tokens, the compiled layers given fixed
shapes. The learner's real `Policy` must give the unpadded log-probs and gradients, compile one graph per padded
shape (no more), and the config must refuse what cannot work with it."""

from __future__ import annotations

import pytest
import torch
from builders import cpu_policy
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.policy import pad_right


def _policy(path: str, monkeypatch, *overrides: str):
    return cpu_policy(path, monkeypatch, "learner.lora.enabled=true", *overrides)


def _logprobs_and_grads(policy, ids: torch.Tensor):
    mask = (ids != 0).long()
    needed = mask.bool().clone()
    needed[:, :3] = False
    logp, entropy = policy.token_logprobs(ids, mask, needed=needed)
    assert logp.shape == ids.shape == entropy.shape  # the padding is cut off again
    policy.wrapped.zero_grad(set_to_none=True)
    (-(logp * needed).sum() - 0.1 * (entropy * needed).sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None}
    return logp.detach() * needed, grads


def _ids(rows: int, lengths: list[int], vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(rows, max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, vocab, (n,), generator=g)
    return ids


@pytest.mark.long  # minutes of compiling or a benchmark's run: make test-all (docs/testing.md)
def test_bucketed_forwards_give_the_eager_numbers_with_one_graph_per_padded_shape(builtin_model_path, monkeypatch):
    eager = _policy(builtin_model_path, monkeypatch, "learner.compile=false")
    bucketed = _policy(builtin_model_path, monkeypatch, "learner.compile=true", "learner.compile_buckets=16")
    assert bucketed.bucket == 16 and not bucketed.shared_prefix  # auto: no packing under fixed shapes
    seen = []
    embed = bucketed.module.get_input_embeddings()
    embed.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    vocab = bucketed.module.config.vocab_size
    layer_code = type(bucketed.module.get_base_model().model.layers[0]).forward.__code__
    graphs = []  # the compiled layer's cache entries (dynamo's guarded graphs) after each forward
    # 3 rows of 19 and 2 of 25 tokens both run as 32; 3 rows of 30 again as (3, 32), from the first graph
    for rows, lengths, seed in [(3, [19, 12, 17], 1), (2, [25, 25], 2), (3, [30, 8, 30], 3)]:
        ids = _ids(rows, lengths, vocab, seed)
        want_logp, want = _logprobs_and_grads(eager, ids)
        got_logp, got = _logprobs_and_grads(bucketed, ids)
        torch.testing.assert_close(got_logp, want_logp, rtol=1e-4, atol=1e-4)
        assert got.keys() == want.keys() and len(got) > 0
        for name, w in want.items():
            assert (got[name] - w).norm() <= 1e-4 * w.norm() + 1e-7, name
        graphs.append(len(_debug_get_cache_entry_list(layer_code)))
    assert seen == [(3, 32), (2, 32), (3, 32)]
    # fixed shapes: (2, 32) compiled graphs of its own, the third forward (3, 32 again) reused the first's
    assert 0 < graphs[0] < graphs[1] == graphs[2]


def test_pad_right_pads_to_the_next_multiple_with_zeros():
    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    padded_ids, padded_mask, needed = pad_right(5, 4, ids, mask, None)
    assert padded_ids.shape == padded_mask.shape == (2, 8) and needed is None
    assert padded_mask[:, 5:].eq(0).all() and padded_ids[:, :5].eq(1).all()
    assert pad_right(8, 4, ids[:, :4].repeat(1, 2))[0].shape == (2, 8)  # already a multiple: unchanged


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["learner.compile_buckets=-1"], "compile_buckets must be >= 0"),
        (["learner.compile_buckets=128", "learner.shared_prefix=true"], "set one of them off"),
        (["learner.compile_buckets=128", "learner.compile=false"], "needs learner.compile"),
    ],
)
def test_compile_buckets_refuses_what_cannot_work_with_it(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["profile=cpu", *overrides])
