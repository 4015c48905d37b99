"""The algorithm module on CPU: every expected number below is derived by hand in the comment next to it."""

import dataclasses
import math

import pytest
import torch

from agentrl_ray.algorithms import (
    LossNorm,
    compute_advantages,
    compute_loss,
    dynamic_sampling_keep,
    echo_coeff_at,
    overlong_penalty,
    sequence_level_ratio,
)
from agentrl_ray.config import AlgorithmConfig, EchoConfig
from agentrl_ray.learner import logprobs
from agentrl_ray.learner.logprobs import token_logprobs_and_entropy
from agentrl_ray.types import TrainBatch

LN2 = math.log(2.0)


def make_batch(action_mask, advantages, env_mask=None, rollout_logprobs=None, truncated=None) -> TrainBatch:
    act = torch.tensor(action_mask, dtype=torch.float32)
    b, t = act.shape
    return TrainBatch(
        input_ids=torch.zeros(b, t, dtype=torch.long),
        attention_mask=torch.ones(b, t, dtype=torch.long),
        action_mask=act,
        env_mask=torch.zeros(b, t) if env_mask is None else torch.tensor(env_mask, dtype=torch.float32),
        rollout_logprobs=torch.zeros(b, t) if rollout_logprobs is None else torch.tensor(rollout_logprobs),
        advantages=torch.tensor(advantages, dtype=torch.float32),
        truncated=torch.zeros(b, dtype=torch.bool) if truncated is None else torch.tensor(truncated),
        policy_version=torch.zeros(b, dtype=torch.long),
    )


def norm_of(batch: TrainBatch, norm_constant: float = 1.0, world_size: int = 1) -> LossNorm:
    return LossNorm.of(batch.action_mask, batch.env_mask, norm_constant, world_size)


def test_loss_norm_counts():
    batch = make_batch([[0, 1, 1], [0, 0, 1]], [1.0, 1.0], env_mask=[[1, 0, 0], [0, 0, 0]])
    assert norm_of(batch, 4.0, 2) == LossNorm(3.0, 2.0, 1.0, 1.0, 4.0, 2)


def loss_and_grad(logprobs, batch, cfg, norm=None, *, old=None, echo_coeff=0.0, ref=None, entropy=None, echo=None):
    lp = torch.tensor(logprobs, dtype=torch.float32, requires_grad=True)
    old = lp.detach().clone() if old is None else torch.tensor(old, dtype=torch.float32)
    ref = None if ref is None else torch.tensor(ref, dtype=torch.float32)
    loss, metrics = compute_loss(
        lp,
        entropy,
        batch,
        cfg,
        norm or norm_of(batch),
        old_logprobs=old,
        echo_coeff=echo_coeff,
        echo=echo,
        ref_logprobs=ref,
    )
    loss.backward()
    return loss.item(), lp.grad, metrics


# ----------------------------------------------------------------------------------------------------------------
# log-probabilities


def test_token_logprobs_are_aligned_to_input_ids():
    # Position 0 predicts token 1 from logits [0, 0]: p = (1/2, 1/2). Position 1 predicts token 2 from [ln 3, 0]:
    # p = (3/4, 1/4). The last position's logits predict nothing.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, -5.0]]])
    ids = torch.tensor([[0, 1, 0]])
    lp, ent = token_logprobs_and_entropy(logits, ids)
    torch.testing.assert_close(lp, torch.tensor([[0.0, math.log(0.5), math.log(0.75)]]))
    # H(1/2, 1/2) = ln 2; H(3/4, 1/4) = -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.562335
    torch.testing.assert_close(ent, torch.tensor([[0.0, LN2, 0.562335]]))


def test_token_logprobs_float32_from_bf16_temperature_and_no_entropy():
    # Temperature 2 halves the logits: [ln 3 / 2, 0] → p(0) = sqrt(3) / (sqrt(3) + 1) = 0.633975
    logits = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]]], dtype=torch.bfloat16)
    lp, ent = token_logprobs_and_entropy(logits, torch.tensor([[1, 0]]), False, temperature=2.0)
    assert lp.dtype == torch.float32 and ent is None
    torch.testing.assert_close(lp, torch.tensor([[0.0, math.log(0.633975)]]), atol=2e-3, rtol=0)


def _reference_logprobs(logits, ids, temperature=1.0):
    logp = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)
    return torch.nn.functional.pad(logp.gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0))


def test_token_logprobs_chunked_forward_and_backward_match_log_softmax(monkeypatch):
    # Chunks of 2 positions (vocab 5, 10 elements) to cross chunk and row boundaries.
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 10)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 5, (3, 7), generator=g)
    weights = torch.randn(3, 7, generator=g, dtype=torch.float64)
    lp, ent = token_logprobs_and_entropy(logits, ids, temperature=0.7)
    ref = _reference_logprobs(logits, ids, 0.7)
    torch.testing.assert_close(lp, ref)
    (ours_grad,) = torch.autograd.grad((lp * weights).sum(), logits)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(ours_grad, ref_grad)
    p = torch.softmax(logits[:, :-1].detach() / 0.7, dim=-1)
    torch.testing.assert_close(ent[:, 1:], -(p * p.log()).sum(-1))
    small = logits[:1, :4].detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: token_logprobs_and_entropy(x, ids[:1, :4], False)[0], (small,))


def test_token_logprobs_bf16_gradient_is_bf16_and_close_to_float32():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 11, generator=g).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    lp, _ = token_logprobs_and_entropy(logits, ids, False)
    lp.sum().backward()
    ref = logits.detach().float().requires_grad_(True)
    _reference_logprobs(ref, ids).sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad.float(), ref.grad, atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------------------------------------------
# advantages

# Two groups, interleaved: group 0 = [3, 1, 2] (mean 2, unbiased std sqrt((1+1+0)/2) = 1),
# group 1 = [0, 4] (mean 2, unbiased std sqrt((4+4)/1) = 2.828427). All five: mean 2, std sqrt(10/4) = 1.581139.
REWARDS = torch.tensor([3.0, 0.0, 1.0, 2.0, 4.0])
GROUPS = torch.tensor([0, 1, 0, 0, 1])


@pytest.mark.parametrize(
    "baseline,scale,expected",
    [
        ("mean", "group", [1.0, -0.707107, -1.0, 0.0, 0.707107]),
        ("mean", "batch", [0.632456, -1.264911, -0.632456, 0.0, 1.264911]),  # [1, -2, -1, 0, 2] / 1.581139
        ("mean", "none", [1.0, -2.0, -1.0, 0.0, 2.0]),
        # RLOO: baseline = mean of the others. 3 - (1+2)/2 = 1.5; 0 - 4 = -4; 1 - (3+2)/2 = -1.5; 2 - 2 = 0; 4 - 0 = 4
        ("rloo", "none", [1.5, -4.0, -1.5, 0.0, 4.0]),
        ("rloo", "group", [1.5, -1.414214, -1.5, 0.0, 1.414214]),  # group 1 divided by 2.828427
        ("rloo", "batch", [0.948683, -2.529822, -0.948683, 0.0, 2.529822]),  # divided by 1.581139
    ],
)
def test_advantages(baseline, scale, expected):
    cfg = AlgorithmConfig(baseline=baseline, advantage_scale=scale)
    torch.testing.assert_close(compute_advantages(REWARDS, GROUPS, cfg, eps=0.0), torch.tensor(expected))


def test_zero_variance_group_and_singleton_get_zero_advantage():
    adv = compute_advantages(torch.tensor([1.0, 1.0, 5.0]), torch.tensor([0, 0, 1]), AlgorithmConfig())
    assert torch.equal(adv, torch.zeros(3))
    adv = compute_advantages(torch.tensor([1.0, 1.0, 5.0]), torch.tensor([0, 0, 1]), AlgorithmConfig(baseline="rloo"))
    assert torch.equal(adv, torch.zeros(3))


# ----------------------------------------------------------------------------------------------------------------
# loss aggregation: ratio 1 everywhere, so each action token's loss is -A and d loss / d logp = -A * weight.
# Row 0: 3 action tokens, A = 1. Row 1: 1 action token, A = -2. Token sum = 3 * (-1) + 1 * 2 = -1.

AGG_BATCH = dict(action_mask=[[0, 1, 1, 1], [0, 1, 0, 0]], advantages=[1.0, -2.0])
AGG_LOGP = [[0.0, -0.5, -1.0, -1.5], [0.0, -2.0, -0.1, -0.1]]


@pytest.mark.parametrize(
    "mode,loss,g0,g1",
    [
        ("token_mean", -0.25, -0.25, 0.5),  # -1 / 4 tokens; per token -A / 4
        ("seq_mean_token_mean", 0.5, -1 / 6, 1.0),  # (-1 + 2) / 2; row 0: -1 / 3 / 2, row 1: 2 / 1 / 2
        ("seq_mean_token_sum", -0.5, -0.5, 1.0),  # (-3 + 2) / 2
        ("seq_mean_token_sum_norm", -1 / 16, -1 / 16, 1 / 8),  # (-3 + 2) / 8 / 2 with norm_constant 8
    ],
)
def test_loss_aggregation(mode, loss, g0, g1):
    batch = make_batch(**AGG_BATCH)
    cfg = AlgorithmConfig(loss_aggregation=mode)
    value, grad, metrics = loss_and_grad(AGG_LOGP, batch, cfg, norm_of(batch, norm_constant=8.0))
    assert value == pytest.approx(loss)
    torch.testing.assert_close(grad, torch.tensor([[0.0, g0, g0, g0], [0.0, g1, 0.0, 0.0]]))
    assert metrics["policy_loss"] == pytest.approx(loss) and metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["action_tokens"] == 4.0 and metrics["clip_frac_low"] == 0.0


def test_mask_truncated_zeroes_policy_loss_of_truncated_rows():
    # Row 1 is truncated: only row 0's -3 remains; the global token count (4) is still the denominator.
    batch = make_batch(**AGG_BATCH, truncated=[False, True])
    value, grad, _ = loss_and_grad(AGG_LOGP, batch, AlgorithmConfig(mask_truncated=True))
    assert value == pytest.approx(-0.75)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.25, -0.25, -0.25], [0.0, 0.0, 0.0, 0.0]]))


def test_entropy_metric_is_mean_over_action_tokens():
    batch = make_batch(**AGG_BATCH)
    entropy = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 6.0, 9.0, 9.0]])
    _, _, metrics = loss_and_grad(AGG_LOGP, batch, AlgorithmConfig(), entropy=entropy)
    assert metrics["entropy"] == pytest.approx(3.0)  # (1 + 2 + 3 + 6) / 4


# ----------------------------------------------------------------------------------------------------------------
# clipping: ratios r = [0.5, 0.9, 1.1, 1.5] (old = 0, logp = ln r), epsilon 0.2, epsilon_high 0.28 → [0.8, 1.28]

RATIOS = [0.5, 0.9, 1.1, 1.5]


def test_clip_high_for_positive_advantage():
    # A = +1: loss_t = -min(r, clip(r)) = -[0.5, 0.9, 1.1, 1.28]; mean = -3.78 / 4 = -0.945.
    # Only r = 1.5 is clipped (no gradient); elsewhere d/dlogp = -r / 4.
    batch = make_batch([[1, 1, 1, 1]], [1.0])
    cfg = AlgorithmConfig(epsilon=0.2, epsilon_high=0.28)
    value, grad, m = loss_and_grad([[math.log(r) for r in RATIOS]], batch, cfg, old=[[0.0] * 4])
    assert value == pytest.approx(-0.945)
    torch.testing.assert_close(grad, torch.tensor([[-0.125, -0.225, -0.275, 0.0]]))
    assert m["clip_frac_high"] == 0.25 and m["clip_frac_low"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0)  # (0.5 + 0.9 + 1.1 + 1.5) / 4


def test_clip_low_for_negative_advantage():
    # A = -1: loss_t = max(r, clip(r)) = [0.8, 0.9, 1.1, 1.5]; mean = 4.3 / 4 = 1.075.
    # r = 0.5 is clipped at 0.8 (no gradient); r = 1.5 is not clipped for A < 0 (PPO's pessimistic bound).
    batch = make_batch([[1, 1, 1, 1]], [-1.0])
    cfg = AlgorithmConfig(epsilon=0.2, epsilon_high=0.28)
    value, grad, m = loss_and_grad([[math.log(r) for r in RATIOS]], batch, cfg, old=[[0.0] * 4])
    assert value == pytest.approx(1.075)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.225, 0.275, 0.375]]))
    assert m["clip_frac_low"] == 0.25 and m["clip_frac_high"] == 0.0


# ----------------------------------------------------------------------------------------------------------------
# token vs sequence importance sampling: two action tokens with logp - old = [ln 2, 0], A = 1, epsilon_high 0.5


def test_token_level_ratio():
    # r = [2, 1]; 2 is clipped at 1.5: loss = -(1.5 + 1) / 2 = -1.25; grad: [0, -1 / 2]
    batch = make_batch([[0, 1, 1]], [1.0])
    cfg = AlgorithmConfig(epsilon_high=0.5, loss_aggregation="seq_mean_token_mean")
    value, grad, _ = loss_and_grad([[0.0, LN2, 0.0]], batch, cfg, old=[[5.0, 0.0, 0.0]])
    assert value == pytest.approx(-1.25)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -0.5]]))


def test_sequence_level_ratio_gspo():
    # s = exp((ln 2 + 0) / 2) = sqrt(2) = 1.414214 < 1.5, unclipped. loss = -s; d/dlogp_t = -s / 2 = -0.707107.
    batch = make_batch([[0, 1, 1]], [1.0])
    cfg = AlgorithmConfig(
        epsilon_high=0.5, importance_sampling_level="sequence", loss_aggregation="seq_mean_token_mean"
    )
    value, grad, m = loss_and_grad([[0.0, LN2, 0.0]], batch, cfg, old=[[5.0, 0.0, 0.0]])
    assert value == pytest.approx(-math.sqrt(2.0))
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.707107, -0.707107]]))
    assert m["ratio_mean"] == pytest.approx(math.sqrt(2.0))
    # With epsilon_high 0.2 the whole sequence is clipped at 1.2: loss -1.2, no gradient, both tokens count as clipped.
    cfg = dataclasses.replace(cfg, epsilon_high=0.2)
    value, grad, m = loss_and_grad([[0.0, LN2, 0.0]], batch, cfg, old=[[5.0, 0.0, 0.0]])
    assert value == pytest.approx(-1.2) and m["clip_frac_high"] == 1.0
    assert torch.equal(grad, torch.zeros(1, 3))


def test_sequence_level_ratio_values():
    # Row 0: mean of [ln 2, ln 8] over 2 tokens = 2 ln 2 → 4. Row 1: no action tokens → exp(0) = 1.
    lp = torch.tensor([[math.log(2.0), math.log(8.0), 7.0], [3.0, 3.0, 3.0]])
    ratio = sequence_level_ratio(lp, torch.zeros(2, 3), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(ratio, torch.tensor([[4.0, 4.0, 4.0], [1.0, 1.0, 1.0]]))


# ----------------------------------------------------------------------------------------------------------------
# KL: one action token, logp = ln 0.5, ref = ln 0.25 → log_r = ref - logp = -ln 2; A = 0 so only beta * KL remains.
# k1 = ln 2 = 0.693147, grad 1.   k2 = (ln 2)^2 / 2 = 0.240227, grad -log_r = ln 2.
# k3 = e^{log_r} - 1 - log_r = 0.5 - 1 + ln 2 = 0.193147, grad 1 - e^{log_r} = 0.5.   beta = 0.1 scales both.


@pytest.mark.parametrize("estimator,kl,grad", [("k1", LN2, 1.0), ("k2", LN2**2 / 2, LN2), ("k3", LN2 - 0.5, 0.5)])
def test_kl_estimators(estimator, kl, grad):
    # The third token is not an action token: its wild logprobs (exp(0 + 200) overflows) must not matter.
    batch = make_batch([[0, 1, 0]], [0.0])
    cfg = AlgorithmConfig(beta=0.1, kl_estimator=estimator)
    lp = [[0.0, math.log(0.5), -200.0]]
    value, g, m = loss_and_grad(lp, batch, cfg, ref=[[0.0, math.log(0.25), 0.0]])
    assert value == pytest.approx(0.1 * kl)
    torch.testing.assert_close(g, torch.tensor([[0.0, 0.1 * grad, 0.0]]))
    assert m["kl"] == pytest.approx(kl) and m["policy_loss"] == 0.0


def test_beta_without_reference_is_an_error():
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_and_grad([[0.0, -1.0]], make_batch([[0, 1]], [1.0]), AlgorithmConfig(beta=0.1))


# ----------------------------------------------------------------------------------------------------------------
# TIS: exp(old - rollout) = [0.5, 2, 4], cap 2 → weights [0.5, 2, 2]. logp = old (PPO ratio 1), A = 1:
# loss = -(0.5 + 2 + 2) / 3 = -1.5, grad = -w / 3.


def test_truncated_importance_sampling():
    old = [[0.0, -1.0, -1.0, -1.0]]
    rollout = [[0.0, -1.0 + LN2, -1.0 - LN2, -1.0 - 2 * LN2]]
    batch = make_batch([[0, 1, 1, 1]], [1.0], rollout_logprobs=rollout)
    value, grad, m = loss_and_grad(old, batch, AlgorithmConfig(tis_cap=2.0), old=old)
    assert value == pytest.approx(-1.5)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1 / 6, -2 / 3, -2 / 3]]))
    assert m["is_clipped_frac"] == pytest.approx(1 / 3) and m["is_masked_frac"] == 0.0
    # learner - rollout = m = [-ln 2, ln 2, 2 ln 2]: mean |m| = 4 ln 2 / 3 = 0.924196;
    # k3 = e^m - 1 - m = [0.193147, 0.306853, 1.613706] → mean 0.704569
    assert m["mismatch_abs"] == pytest.approx(4 * LN2 / 3)
    assert m["mismatch_kl"] == pytest.approx(0.704569, abs=1e-6)


def test_tis_off_ignores_rollout_mismatch_weights():
    # Same batch, tis_cap 0: the ratio is against old (= logp), weights 1 → loss -1.
    rollout = [[0.0, -1.0 + LN2, -1.0 - LN2, -1.0 - 2 * LN2]]
    batch = make_batch([[0, 1, 1, 1]], [1.0], rollout_logprobs=rollout)
    value, _, m = loss_and_grad([[0.0, -1.0, -1.0, -1.0]], batch, AlgorithmConfig())
    assert value == pytest.approx(-1.0) and m["is_clipped_frac"] == 0.0 and m["is_masked_frac"] == 0.0


# Masked IS (IcePop): the same w = [0.5, 2, 4]; band [0.5, 2] keeps the first two at their w and masks the third:
# loss = -(0.5 + 2 + 0) / 3 = -5/6, grad = -w / 3 inside the band, 0 outside. A band from 0.6 masks w = 0.5 too.


@pytest.mark.parametrize(
    "low,value,grad,masked",
    [(0.5, -5 / 6, [0.0, -1 / 6, -2 / 3, 0.0], 1 / 3), (0.6, -2 / 3, [0.0, 0.0, -2 / 3, 0.0], 2 / 3)],
)
def test_masked_importance_sampling_leaves_tokens_outside_the_band_out(low, value, grad, masked):
    old = [[0.0, -1.0, -1.0, -1.0]]
    rollout = [[0.0, -1.0 + LN2, -1.0 - LN2, -1.0 - 2 * LN2]]
    batch = make_batch([[0, 1, 1, 1]], [1.0], rollout_logprobs=rollout)
    cfg = AlgorithmConfig(tis_cap=2.0, is_correction="masked", is_band_low=low)
    got, g, m = loss_and_grad(old, batch, cfg, old=old)
    assert got == pytest.approx(value)
    torch.testing.assert_close(g, torch.tensor([grad]))
    assert m["is_masked_frac"] == pytest.approx(masked) and m["is_clipped_frac"] == 0.0


# Sequence-level IS: row 0's w = [0.5, 2, 4] has geometric mean exp((-ln 2 + ln 2 + 2 ln 2) / 3) = 2^(2/3) = 1.5874;
# row 1's single action token has w = 1/4 (its prompt and padding positions, whatever their values, do not count).
# Cap 2: weights [2^(2/3)] x 3 and [1/4]; token_mean over 4 tokens: loss = -(3 * 2^(2/3) + 1/4) / 4.
# Cap 1.5 clips row 0 to 1.5: loss = -(4.5 + 0.25) / 4, and 3 of the 4 tokens were clipped.


@pytest.mark.parametrize("cap,row0,clipped", [(2.0, 2 ** (2 / 3), 0.0), (1.5, 1.5, 0.75)])
def test_sequence_level_importance_sampling_weights_each_sequence_by_its_geometric_mean(cap, row0, clipped):
    old = [[0.0, -1.0, -1.0, -1.0], [0.0, -1.0, 0.0, 0.0]]
    rollout = [[0.0, -1.0 + LN2, -1.0 - LN2, -1.0 - 2 * LN2], [5.0, -1.0 + 2 * LN2, -3.0, 7.0]]
    batch = make_batch([[0, 1, 1, 1], [0, 1, 0, 0]], [1.0, 1.0], rollout_logprobs=rollout)
    cfg = AlgorithmConfig(tis_cap=cap, is_correction="sequence")
    value, grad, m = loss_and_grad(old, batch, cfg, old=old)
    assert value == pytest.approx(-(3 * row0 + 0.25) / 4)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -row0 / 4, -row0 / 4, -row0 / 4], [0.0, -1 / 16, 0.0, 0.0]]))
    assert m["is_clipped_frac"] == pytest.approx(clipped) and m["is_masked_frac"] == 0.0


def test_an_unknown_correction_is_a_config_error():
    from agentrl_ray.config import ConfigError
    from agentrl_ray.infra.profiles import load_config

    with pytest.raises(ConfigError, match="is_correction"):
        load_config(None, ["algorithm.is_correction=clipped"])
    with pytest.raises(ConfigError, match="is_band_low"):
        load_config(None, ["algorithm.is_band_low=0"])


# ----------------------------------------------------------------------------------------------------------------
# ECHO. Row 0 env logp [-1, -3] (CE 1, 3), row 1 env logp [-5] (CE 5), row 2 no env tokens. A = 0: no policy loss.
# Counts: 3 env tokens, 2 sequences with env tokens, 3 sequences, norm_constant 4. lambda = 0.5.

ECHO_ENV = [[0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
ECHO_LOGP = [[0.0, -1.0, -3.0, -0.2], [0.0, -0.3, -5.0, -0.2], [0.0, -0.4, -0.1, -0.2]]


@pytest.mark.parametrize(
    "mode,value,g0,g1",
    [
        ("token_mean", 1.5, -1 / 6, -1 / 6),  # 0.5 * (1 + 3 + 5) / 3; grad -0.5 / 3
        # Over the sequences with env tokens: 0.5 * (2 + 5) / 2; row 0: -0.5 / 2 / 2, row 1: -0.5 / 1 / 2
        ("seq_mean_token_mean", 1.75, -0.125, -0.25),
        ("seq_mean_token_sum_norm", 0.375, -1 / 24, -1 / 24),  # 0.5 * 9 / 4 / 3; grad -0.5 / 4 / 3
    ],
)
def test_echo_normalization(mode, value, g0, g1):
    batch = make_batch([[0, 0, 0, 1]] * 3, [0.0, 0.0, 0.0], env_mask=ECHO_ENV)
    echo = EchoConfig(coeff=0.5, normalization=mode)
    norm = norm_of(batch, norm_constant=4.0)
    loss, grad, m = loss_and_grad(ECHO_LOGP, batch, AlgorithmConfig(), norm, echo_coeff=0.5, echo=echo)
    assert loss == pytest.approx(value)
    expected = torch.zeros(3, 4)
    expected[0, 1:3] = g0
    expected[1, 2] = g1
    torch.testing.assert_close(grad, expected)
    assert m["echo_ce"] == pytest.approx(3.0)  # (1 + 3 + 5) / 3
    assert m["echo_weighted"] == pytest.approx(value) and m["env_tokens"] == 3.0


def test_echo_only_ignores_rewards():
    # Only 0.5 * (1 + 3 + 5) / 3 = 1.5 remains, whatever the advantages are.
    cfg, echo = AlgorithmConfig(beta=0.1), EchoConfig(coeff=0.5, only=True)
    results = []
    for adv in ([1.0, -2.0, 0.5], [7.0, 3.0, -9.0]):
        batch = make_batch([[0, 0, 0, 1]] * 3, adv, env_mask=ECHO_ENV)
        old = [[0.0, 0.0, 0.0, 1.0]] * 3  # PPO ratio far from 1, so a policy term would show
        results.append(loss_and_grad(ECHO_LOGP, batch, cfg, old=old, echo_coeff=0.5, echo=echo))
    assert results[0][0] == pytest.approx(1.5) and results[1][0] == pytest.approx(1.5)
    torch.testing.assert_close(results[0][1], results[1][1])
    assert results[0][1][:, 3].abs().sum() == 0  # action tokens get no gradient


def test_echo_coeff_zero_leaves_policy_loss_alone():
    batch = make_batch(**AGG_BATCH, env_mask=[[1, 0, 0, 0], [0, 0, 1, 1]])
    value, grad, m = loss_and_grad(AGG_LOGP, batch, AlgorithmConfig(), echo_coeff=0.0)
    assert value == pytest.approx(-0.25) and grad[1, 2:].abs().sum() == 0
    assert m["echo_ce"] == pytest.approx((0.0 + 0.1 + 0.1) / 3)  # still reported


# ----------------------------------------------------------------------------------------------------------------
# schedule, dynamic sampling, overlong penalty


def test_echo_schedules():
    base = dict(coeff=1.0, final_coeff=0.2, decay_steps=10)
    constant = EchoConfig(**base)
    linear = EchoConfig(**base, schedule="linear")
    step = EchoConfig(**base, schedule="step")
    assert echo_coeff_at(constant, 0) == 1.0 and echo_coeff_at(constant, 100) == 1.0
    # linear: 1 + (0.2 - 1) * min(1, s / 10)
    assert [echo_coeff_at(linear, s) for s in (0, 5, 10, 20)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    assert [echo_coeff_at(step, s) for s in (0, 9, 10, 50)] == [1.0, 1.0, 0.2, 0.2]


def test_dynamic_sampling_keep():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 1])
    assert dynamic_sampling_keep(rewards, groups).tolist() == [False, False, True, True, False, False, True]


def test_overlong_penalty():
    # max_len 100, buffer 20: free up to 80, then (80 - L) / 20, -1 from 100 on; times the factor.
    lengths = torch.tensor([50, 80, 90, 100, 120])
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20, 1.0), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20, 2.0), torch.tensor([0.0, 0.0, -1.0, -2.0, -2.0]))


# ----------------------------------------------------------------------------------------------------------------
# split invariance: micro-batches and ranks give the full-batch gradient, for every aggregation and ECHO mode


def _random_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    b, t, v = 7, 9, 6
    lengths = [9, 5, 7, 3, 8, 6, 4]
    ids = torch.randint(0, v, (b, t), generator=g)
    att = torch.tensor([[1] * n + [0] * (t - n) for n in lengths])
    roles = torch.randint(0, 3, (b, t), generator=g) * att  # 0 prompt/padding, 1 action, 2 env
    roles[:, 0] = 0
    act, env = (roles == 1).float(), (roles == 2).float()
    env[2] = 0.0  # a sequence without env tokens
    batch = TrainBatch(
        input_ids=ids,
        attention_mask=att,
        action_mask=act,
        env_mask=env,
        rollout_logprobs=-torch.rand(b, t, generator=g) * 2 * act,
        advantages=torch.randn(b, generator=g),
        truncated=torch.tensor([False, True, False, False, False, True, False]),
        policy_version=torch.zeros(b, dtype=torch.long),
    )
    logits = torch.randn(b, t, v, generator=g)
    old = (token_logprobs_and_entropy(logits + 0.3 * torch.randn(b, t, v, generator=g), ids, False)[0]).detach()
    ref = (token_logprobs_and_entropy(logits + 0.3 * torch.randn(b, t, v, generator=g), ids, False)[0]).detach()
    return batch, logits, old, ref


def _step_loss(logits, batch, old, ref, cfg, echo, world: int, micro: int, rows_of_rank) -> torch.Tensor:
    """What the learner does: each rank sums its micro-batch losses; DDP then averages the ranks' gradients."""
    norm = norm_of(batch, norm_constant=12.0, world_size=world)
    total = 0.0
    for rank in range(world):
        rows = rows_of_rank[rank]
        for chunk in torch.tensor_split(torch.tensor(rows), micro):
            t = int(batch.attention_mask[chunk].sum(dim=1).max())  # trimmed to the longest sequence
            mb = TrainBatch(**{k: (v[chunk][:, :t] if v.dim() == 2 else v[chunk]) for k, v in batch.__dict__.items()})
            lp, ent = token_logprobs_and_entropy(logits[chunk][:, :t], mb.input_ids)
            loss, _ = compute_loss(
                lp,
                ent,
                mb,
                cfg,
                norm,
                old_logprobs=old[chunk][:, :t],
                echo_coeff=0.7,
                echo=echo,
                ref_logprobs=ref[chunk][:, :t],
            )
            total = total + loss / world
    return total


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("world_norm", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batch_and_rank_split_leaves_gradient_unchanged(agg, world_norm, level):
    batch, logits, old, ref = _random_case(0)
    cfg = AlgorithmConfig(
        loss_aggregation=agg,
        importance_sampling_level=level,
        beta=0.05,
        tis_cap=1.5,
        mask_truncated=True,
        epsilon=0.1,
        epsilon_high=0.15,
    )
    grads = []
    for world, micro, rows in [(1, 1, [range(7)]), (1, 3, [range(7)]), (2, 2, [range(4), range(4, 7)])]:
        leaf = logits.clone().requires_grad_(True)
        echo = EchoConfig(coeff=0.7, normalization=world_norm)
        _step_loss(leaf, batch, old, ref, cfg, echo, world, micro, [list(r) for r in rows]).backward()
        grads.append(leaf.grad)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[2], grads[0], atol=1e-6, rtol=1e-5)
