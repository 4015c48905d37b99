"""Micro-batching: every row exactly once, rows kept whole and aligned, little padding."""

import torch

from agentrl_ray.learner.batching import micro_batches
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
