"""Micro-batching: every row exactly once, rows kept whole and aligned, little padding; how many micro-batches a
step runs, by sequences and by tokens."""

import pytest
import torch

from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.batching import micro_batch_count, micro_batches
from agentrl_ray.types import TrainBatch


def _batch(lengths):
    b, t = len(lengths), max(lengths)
    mask = torch.tensor([[1] * n + [0] * (t - n) for n in lengths])
    ids = torch.arange(b)[:, None] * 1000 + torch.arange(t)[None] + 1  # (B, T): row r holds r*1000 + position + 1
    ids = ids * mask
    return TrainBatch(
        input_ids=ids,
        attention_mask=mask,
        action_mask=mask.float(),
        env_mask=torch.zeros(b, t),
        rollout_logprobs=-ids.float() * mask,
        advantages=torch.arange(b, dtype=torch.float32),
        truncated=torch.zeros(b, dtype=torch.bool),
        policy_version=torch.zeros(b, dtype=torch.long),
    )


def test_rows_are_grouped_by_length_and_kept_whole():
    lengths = [90, 12, 60, 15, 88, 14, 61, 10]
    batch = _batch(lengths)
    mbs = micro_batches(batch, 3)
    assert len(mbs) == 3 and all(w == 1.0 for _, w in mbs)
    seen = []
    for mb, _ in mbs:
        real = mb.attention_mask.sum(dim=1)
        assert mb.input_ids.shape[1] == int(real.max())  # trimmed to its longest row
        for r in range(len(mb)):
            row = int(mb.advantages[r])  # the row's identity travels with every field
            n = lengths[row]
            assert int(real[r]) == n
            assert mb.input_ids[r, :n].tolist() == [row * 1000 + p + 1 for p in range(n)]
            assert torch.equal(mb.rollout_logprobs[r, :n], -mb.input_ids[r, :n].float())
            seen.append(row)
    assert sorted(seen) == list(range(len(lengths)))
    padded = sum(mb.input_ids.numel() for mb, _ in mbs)

    def cost(rows):  # padded tokens of 3 micro-batches cut from rows in this order
        cuts = [rows[len(rows) * i // 3 : len(rows) * (i + 1) // 3] for i in range(3)]
        return sum(max(c) * len(c) for c in cuts)

    assert padded == cost(sorted(lengths)) == 474
    assert cost(lengths) == 627  # in arrival order


def test_more_micro_batches_than_rows_gets_zero_weight_fillers():
    mbs = micro_batches(_batch([5, 7]), 3)
    assert [w for _, w in mbs].count(0.0) == 1


def test_micro_batches_by_sequences_alone_as_before():
    batch = _batch([100] * 10)
    assert micro_batch_count(batch, world=1, size=4) == 3  # ceil(10 / 4)
    assert micro_batch_count(batch, world=2, size=4) == 2  # 5 rows a rank
    assert micro_batch_count(_batch([3]), world=4, size=4) == 1  # ranks without rows still run one (a filler)


@pytest.mark.parametrize("world", [1, 2])
def test_a_token_budget_splits_long_sequences_and_keeps_short_ones_together(world):
    short = _batch([100] * 16)  # 1,600 tokens
    assert micro_batch_count(short, world, size=32, tokens=2_000) == 1
    long = _batch([1_000] * 16)
    n = micro_batch_count(long, world, size=32, tokens=2_000)
    assert n == 8 // world  # two 1,000-token sequences fit 2,000 tokens
    mixed = _batch([40, 900, 35, 800, 50, 60, 700, 45, 30, 990])
    n = micro_batch_count(mixed, 1, size=32, tokens=1_000)
    mbs = micro_batches(mixed, n)
    assert all(mb.input_ids.numel() <= 1_000 for mb, _ in mbs)  # rows x longest, as trained
    assert any(mb.input_ids.numel() > 1_000 for mb, _ in micro_batches(mixed, n - 1))  # and the fewest that fit
    assert micro_batch_count(_batch([100] * 10), 1, size=2, tokens=1_000) == 5  # the sequence cap still holds
    assert micro_batch_count(_batch([5_000, 10]), 1, size=32, tokens=1_000) == 2  # one sequence alone may pass it


def test_the_gpu_profile_sizes_micro_batches_by_tokens_within_the_old_memory():
    learner = load_config(None, ["profile=gpu"]).learner
    rollout = load_config(None, ["profile=gpu"]).rollout
    assert learner.micro_batch_tokens == 4 * rollout.max_total_tokens  # the former 4 longest sequences
    assert learner.micro_batch_size == 32
    with pytest.raises(Exception, match="learner.micro_batch_tokens must be >= 0"):
        load_config(None, ["learner.micro_batch_tokens=-1"])
