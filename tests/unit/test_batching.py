"""Micro-batching: every row exactly once, rows kept whole and aligned, little padding; how many micro-batches a
step runs, by sequences and by tokens; which rows have a gradient, and leaving the others out keeps the step's
gradient."""

import pytest
import torch

from agentrl_ray.algorithms import LossNorm, compute_loss
from agentrl_ray.config import AlgorithmConfig, EchoConfig, LearnerConfig
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.batching import (
    build_batch,
    micro_batch_count,
    micro_batches,
    rank_micro_batches,
    rows_with_gradient,
)
from agentrl_ray.types import TrainBatch, Trajectory, TrajectoryGroup


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


# ------------------------------------------------------------ rows without a gradient (learner.skip_zero_gradient_rows)


def _traj(prompt: str, index: int, reward: float, *, env: bool = False, truncated: bool = False) -> Trajectory:
    """A 3-token prompt, then 3 action tokens (with `env`: 2 tool-output tokens and 2 more action tokens)."""
    roles = [0, 0, 0, 1, 1, 1] + ([2, 2, 1, 1] if env else [])
    ids = [(7 * index + 3 * k + len(prompt)) % 29 + 1 for k in range(len(roles))]
    return Trajectory(
        prompt_id=prompt,
        sample_index=index,
        token_ids=ids,
        action_mask=[int(r == 1) for r in roles],
        env_mask=[int(r == 2) for r in roles],
        template_mask=[0] * len(roles),
        rollout_logprobs=[-1.0 - 0.1 * k if r == 1 else 0.0 for k, r in enumerate(roles)],
        reward=reward,
        policy_version=0,
        finish_reason="length" if truncated else "answer",
        prompt_len=3,
    )


def _groups() -> list[TrajectoryGroup]:
    return [
        TrajectoryGroup("solved", [_traj("solved", i, 1.0) for i in range(3)]),  # all equal: advantage 0
        TrajectoryGroup("varied", [_traj("varied", 0, 0.0), _traj("varied", 1, 1.0), _traj("varied", 2, 0.5)]),
        TrajectoryGroup("tools", [_traj("tools", i, 0.0, env=True) for i in range(2)]),  # advantage 0, tool output
        TrajectoryGroup("cut", [_traj("cut", 0, 0.0, truncated=True), _traj("cut", 1, 1.0)]),
    ]


def test_the_rows_with_a_gradient():
    batch = build_batch(_groups(), AlgorithmConfig(), pad_id=0, max_total_tokens=16)
    plain = rows_with_gradient(batch, AlgorithmConfig(), echo_coeff=0.0, echo_only=False).tolist()
    # "varied": rewards 0, 1, 0.5 around a mean of 0.5, so its third row's advantage is 0 too
    assert plain == [False] * 3 + [True, True, False] + [False] * 2 + [True] * 2
    echo = rows_with_gradient(batch, AlgorithmConfig(), echo_coeff=0.1, echo_only=False).tolist()
    assert echo == [False] * 3 + [True, True, False] + [True] * 2 + [True] * 2  # the tool rows' ECHO term
    only = rows_with_gradient(batch, AlgorithmConfig(), echo_coeff=0.1, echo_only=True).tolist()
    assert only == [False] * 6 + [True] * 2 + [False] * 2
    kl = rows_with_gradient(batch, AlgorithmConfig(beta=0.1), echo_coeff=0.0, echo_only=False).tolist()
    assert kl == [True] * 10  # the KL term has a gradient whatever the advantage
    cut = rows_with_gradient(batch, AlgorithmConfig(mask_truncated=True), echo_coeff=0.0, echo_only=False).tolist()
    assert cut == [False] * 3 + [True, True, False] + [False] * 2 + [False, True]


class _TinyLM(torch.nn.Module):
    """log p(token t | token t-1): enough model to give every row's loss a gradient of its own."""

    def __init__(self, vocab: int = 32, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T) log-probs, 0 at position 0
        logp = torch.log_softmax(self.head(self.emb(ids[:, :-1])), dim=-1)  # (B, T-1, V)
        picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
        return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def _step_gradient(skip: bool, world: int, algo: AlgorithmConfig, echo: EchoConfig, groups) -> tuple[dict, int]:
    """The gradient DDP would apply (the ranks' sums of their micro-batches' weighted losses, averaged), and how many
    rows the ranks computed."""
    model = _TinyLM()
    full = build_batch(groups, algo, pad_id=0, max_total_tokens=16)
    norm = LossNorm.of(full.action_mask, full.env_mask, 16, world)
    live = rows_with_gradient(full, algo, echo.coeff, echo.only)
    trained = full.select(live) if skip else full
    lc = LearnerConfig(micro_batch_size=2)
    computed = 0
    for rank in range(world):
        for mb, weight in rank_micro_batches(full, trained, rank, world, lc, share_prefix=False):
            logprobs = model(mb.input_ids)
            loss, _ = compute_loss(
                logprobs, None, mb, algo, norm, old_logprobs=mb.rollout_logprobs, echo_coeff=echo.coeff, echo=echo
            )
            (loss * weight / world).backward()
            computed += len(mb) if weight else 0
    return {n: p.grad.clone() for n, p in model.named_parameters()}, computed


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize(
    "algo,echo",
    [
        (AlgorithmConfig(), EchoConfig()),
        (AlgorithmConfig(), EchoConfig(coeff=0.5)),
        (AlgorithmConfig(mask_truncated=True, loss_aggregation="seq_mean_token_mean"), EchoConfig()),
    ],
    ids=["grpo", "echo", "masked-truncation"],
)
def test_leaving_out_the_rows_without_a_gradient_keeps_the_gradient(world, algo, echo):
    every, all_rows = _step_gradient(False, world, algo, echo, _groups())
    some, fewer = _step_gradient(True, world, algo, echo, _groups())
    assert all_rows == 10 and fewer < all_rows
    assert any(g.abs().max() > 1e-3 for g in every.values())  # a gradient to compare
    for name, g in every.items():
        torch.testing.assert_close(some[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_a_step_without_any_gradient_still_runs_one_zero_weight_row_on_every_rank():
    solved = [TrajectoryGroup("solved", [_traj("solved", i, 1.0) for i in range(3)])]
    full = build_batch(solved, AlgorithmConfig(), pad_id=0, max_total_tokens=16)
    live = rows_with_gradient(full, AlgorithmConfig(), echo_coeff=0.0, echo_only=False)
    assert not live.any()
    lc = LearnerConfig(micro_batch_size=2)
    for rank in range(2):
        mbs = rank_micro_batches(full, full.select(live), rank, 2, lc, share_prefix=False)
        assert [(len(mb), w) for mb, w in mbs] == [(1, 0.0)]
        assert mbs[0][0].input_ids.shape[1] == 6  # trimmed to its row
    grads, computed = _step_gradient(True, 2, AlgorithmConfig(), EchoConfig(), solved)
    assert computed == 0 and all(torch.count_nonzero(g) == 0 for g in grads.values())  # zeros, not None


def test_fewer_rows_than_ranks_give_the_rank_without_rows_fillers():
    varied = [TrajectoryGroup("varied", [_traj("varied", 0, 0.0), _traj("varied", 1, 1.0)])]
    full = build_batch(varied, AlgorithmConfig(), pad_id=0, max_total_tokens=16)
    lc = LearnerConfig(micro_batch_size=1)
    per_rank = [rank_micro_batches(full, full, rank, 3, lc, share_prefix=False) for rank in range(3)]
    assert [[w for _, w in mbs] for mbs in per_rank] == [[0.0], [1.0], [1.0]]  # the same count on every rank
