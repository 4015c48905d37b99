"""The RL algorithm as pure tensor functions: GRPO-family policy loss + the ECHO loss.

No Ray, vLLM or DeepSpeed here: everything is plain torch and is tested on CPU with hand-computed numbers
(`tests/unit/test_algorithms.py`) and against TRL's GRPOTrainer (`tests/unit/test_trl_crosscheck.py`).

Base algorithm: GRPO, DeepSeekMath (https://arxiv.org/abs/2402.03300): group-relative advantages, PPO clipped
ratio per token, KL to a frozen reference added to the loss. Where we deviate from the paper, and why:

1. Advantages: the paper's (r - mean) / std is the default (`baseline=mean, advantage_scale=group`; std is the
   unbiased sample std, as in TRL). Also: the leave-one-out baseline (`rloo`, https://arxiv.org/abs/2402.14740),
   batch-level std (`advantage_scale=batch`: std of all rewards of the step) and no scaling (`none`, Dr. GRPO,
   https://arxiv.org/abs/2503.20783, which shows the std division biases towards easy/hard prompts).
2. Loss aggregation: the paper averages per sequence then over sequences (`seq_mean_token_mean`). The default is
   `token_mean` over all action tokens of the step (DAPO, https://arxiv.org/abs/2503.14476: long sequences are not
   down-weighted); also `seq_mean_token_sum` and Dr. GRPO's `seq_mean_token_sum_norm` (sum / a constant length).
   Every mode divides by counts of the WHOLE step (`LossNorm`), so micro-batching and data parallelism do not
   change the gradient.
3. Clip-higher (DAPO): separate `epsilon` (low) and `epsilon_high`.
4. Sequence-level importance ratio (GSPO, https://arxiv.org/abs/2507.18071), in its GSPO-token form.
5. Multi-turn agents: only action tokens (sampled by the policy) carry the policy loss; tool output is context.
6. Off-policy corrections of the engine/learner mismatch: vLLM's sampling probabilities differ from the learner's,
   so with `tis_cap > 0` the PPO ratio is taken against the learner's own recomputed logprobs and each token's loss
   is weighted from w = pi_learner_old / pi_rollout (`is_correction`): truncated IS, min(w, cap) (TIS; Yao et al.
   2025, "Your efficient RL framework secretly brings you off-policy RL training",
   https://fengyao.notion.site/off-policy-rl); masked IS, w inside [is_band_low, cap] and 0 outside, so that tokens
   the engine and learner disagree on leave the loss instead of being clipped (IcePop, Ring-1T,
   https://arxiv.org/abs/2510.18855); sequence-level IS, every token of a sequence weighted by min(geometric mean
   of its tokens' w, cap) (the length-normalized sequence ratio of GSPO, https://arxiv.org/abs/2507.18071).
7. DAPO data shaping: dynamic sampling (drop zero-variance groups), overlong filtering (`mask_truncated`) and the
   soft overlong punishment (`overlong_penalty`).
8. ECHO (https://arxiv.org/abs/2605.24517, "ECHO: Terminal Agents Learn World Models for Free"): the same forward
   pass also scores the environment's tokens; lambda * their cross-entropy is added, teaching the policy to predict
   what its tools will answer. Its settings are the `echo` config section; its normalization uses the policy loss's
   aggregation names (`token_mean`, `seq_mean_token_mean` over the sequences that have environment tokens,
   `seq_mean_token_sum_norm`). `echo.only` trains on that loss alone (rewards are ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl_ray.config import AlgorithmConfig, EchoConfig
from agentrl_ray.types import TrainBatch

# ----------------------------------------------------------------------------------------------------------------
# Rewards → advantages, data shaping


def _group_sums(values: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample sum of its group's values and its group size, both (N,)."""
    n_groups = int(group_index.max()) + 1
    sums = values.new_zeros(n_groups).index_add_(0, group_index, values)  # (G,)
    counts = values.new_zeros(n_groups).index_add_(0, group_index, torch.ones_like(values))  # (G,)
    return sums[group_index], counts[group_index]


def _unbiased_std(values: Tensor, mean: Tensor, count: Tensor, group_index: Tensor | None) -> Tensor:
    """Sample std with Bessel's correction (as TRL and verl); 0 for a single sample."""
    sq = (values - mean) ** 2  # (N,)
    total = _group_sums(sq, group_index)[0] if group_index is not None else sq.sum().expand_as(sq)
    return torch.where(count > 1, total / (count - 1).clamp(min=1), torch.zeros_like(total)).sqrt()  # (N,)


def compute_advantages(rewards: Tensor, group_index: Tensor, cfg: AlgorithmConfig, eps: float = 1e-6) -> Tensor:
    """One advantage per sample, (N,): (reward - baseline) / (std + eps), std per `cfg.advantage_scale`.

    baseline `mean`: the group's mean reward (GRPO). `rloo`: the mean of the OTHER samples of the group (RLOO,
    https://arxiv.org/abs/2402.14740), equal to G/(G-1) times the mean-baseline advantage; a group of one gets 0.
    advantage_scale `group`: the group's reward std; `batch`: the std of all rewards in the step; `none`: 1.
    """
    rewards = rewards.float()  # (N,)
    group_sum, group_size = _group_sums(rewards, group_index)  # (N,), (N,)
    group_mean = group_sum / group_size
    if cfg.baseline == "mean":
        centered = rewards - group_mean
    else:
        others = (group_size - 1).clamp(min=1)
        centered = torch.where(group_size > 1, rewards - (group_sum - rewards) / others, torch.zeros_like(rewards))
    if cfg.advantage_scale == "group":
        return centered / (_unbiased_std(rewards, group_mean, group_size, group_index) + eps)
    if cfg.advantage_scale == "batch":
        n = torch.full_like(rewards, rewards.numel())
        return centered / (_unbiased_std(rewards, rewards.mean(), n, None) + eps)
    return centered


def dynamic_sampling_keep(rewards: Tensor, group_index: Tensor) -> Tensor:
    """DAPO dynamic sampling: bool (N,), False for every sample of a group whose rewards are all equal.

    Such a group has zero advantage everywhere: it adds no gradient, only dilutes the token-mean normalization.
    """
    n_groups = int(group_index.max()) + 1
    hi = rewards.new_full((n_groups,), float("-inf")).scatter_reduce(0, group_index, rewards, "amax")  # (G,)
    lo = rewards.new_full((n_groups,), float("inf")).scatter_reduce(0, group_index, rewards, "amin")  # (G,)
    return (hi > lo)[group_index]


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float) -> Tensor:
    """DAPO soft overlong punishment (eq. 13), (N,) in [-factor, 0] to add to the rewards.

    0 up to max_len - buffer tokens, then a linear ramp down to -factor at max_len, and -factor beyond.
    """
    start = max_len - buffer
    ramp = (start - lengths.float()) / max(buffer, 1)  # (N,), negative past `start`
    return factor * ramp.clamp(min=-1.0, max=0.0)


def echo_coeff_at(cfg: EchoConfig, step: int) -> float:
    """ECHO lambda at optimizer step `step`: constant, linear decay, or one drop at `decay_steps`."""
    start, final = cfg.coeff, cfg.final_coeff
    if cfg.schedule == "constant":
        return start
    if cfg.schedule == "linear":
        frac = min(1.0, step / cfg.decay_steps)
        return start + (final - start) * frac
    return start if step < cfg.decay_steps else final


# ----------------------------------------------------------------------------------------------------------------
# Loss


@dataclass
class LossNorm:
    """Global denominators of one optimizer step: counted over every rank and micro-batch by the learner.

    Each micro-batch's loss is its own sum divided by these counts (times `world_size`, since DDP averages the
    ranks' gradients), so summing micro-batches and averaging ranks gives exactly the full-batch loss.
    """

    action_tokens: float
    sequences: float
    env_tokens: float
    env_sequences: float  # sequences with at least one environment token
    norm_constant: float  # the fixed length of the *_sum_norm modes (Dr. GRPO)
    world_size: int

    @classmethod
    def of(cls, action_mask: Tensor, env_mask: Tensor, norm_constant: float, world_size: int) -> LossNorm:
        """The counts of a batch's masks (B, T): the whole step's (the learner's), or one micro-batch's alone
        (world size 1, for metrics that describe just that micro-batch)."""
        return cls(
            action_tokens=float(action_mask.sum()),
            sequences=float(action_mask.shape[0]),
            env_tokens=float(env_mask.sum()),
            env_sequences=float((env_mask.sum(dim=1) > 0).sum()),
            norm_constant=float(norm_constant),
            world_size=world_size,
        )


def aggregate(values: Tensor, mask: Tensor, mode: str, tokens: float, sequences: float, norm: LossNorm) -> Tensor:
    """Reduce per-token values (B, T) over `mask` to this micro-batch's share of the step's scalar.

    `tokens` / `sequences` are the global counts for this loss (action or env); max(1, .) keeps empty steps finite.
    token_mean: sum / tokens. seq_mean_token_mean: per-sequence mean, summed, / sequences. seq_mean_token_sum:
    per-sequence sum / sequences. seq_mean_token_sum_norm: sum / constant / sequences.
    """
    masked = values * mask  # (B, T)
    if mode == "token_mean":
        total = masked.sum() / max(tokens, 1.0)
    elif mode == "seq_mean_token_mean":
        total = (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum() / max(sequences, 1.0)
    elif mode == "seq_mean_token_sum":
        total = masked.sum() / max(sequences, 1.0)
    elif mode == "seq_mean_token_sum_norm":
        total = masked.sum() / max(norm.norm_constant, 1.0) / max(sequences, 1.0)
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}")
    return total * norm.world_size


def sequence_level_ratio(logprobs: Tensor, old_logprobs: Tensor, action_mask: Tensor) -> Tensor:
    """GSPO importance ratio in its GSPO-token form, (B, T).

    GSPO (https://arxiv.org/abs/2507.18071, eq. 7) uses one length-normalized ratio per sequence,
    s_i = exp(mean over action tokens of (logp - old)). GSPO-token (eq. 13) writes it per token as
    s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]: every token's value is s_i (so clipping acts per sequence) and
    d s_i,t / d logp_t = s_i. Averaged over a sequence's tokens this is exactly GSPO's gradient; written per token it
    composes with every loss aggregation (e.g. token_mean then weights each sequence by its length, like TRL's
    sequence level with its token-sum losses).
    """
    diff = torch.where(action_mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))  # (B, T)
    log_s = diff.sum(dim=1, keepdim=True) / action_mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
    return torch.exp(log_s.detach() + logprobs - logprobs.detach())  # (B, T), value s_i broadcast


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref), (B, T): Schulman's k1/k2/k3 (http://joschu.net/blog/kl-approx.html).

    With log_r = ref - logp: k1 = -log_r, k2 = log_r^2 / 2, k3 = exp(log_r) - 1 - log_r (unbiased and >= 0; GRPO's).
    """
    log_r = ref_logprobs - logprobs  # (B, T)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}")


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))


def _policy_terms(
    logprobs: Tensor, batch: TrainBatch, cfg: AlgorithmConfig, old_logprobs: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """Per-token clipped policy loss (B, T), TIS-weighted, before aggregation; and its token-level metrics."""
    if cfg.importance_sampling_level == "sequence":
        ratio = sequence_level_ratio(logprobs, old_logprobs, mask)  # (B, T)
    else:
        # Outside the mask the difference may be anything (prompt, padding): zero it so exp() stays finite.
        ratio = torch.exp(torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs)))  # (B, T)
    adv = batch.advantages.float().unsqueeze(1)  # (B, 1)
    clipped = ratio.clamp(1.0 - cfg.epsilon, 1.0 + cfg.epsilon_high)  # (B, T)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)  # (B, T): PPO's pessimistic bound
    metrics = {
        "clip_frac_low": _masked_mean(((ratio < 1.0 - cfg.epsilon) & (adv < 0)).float(), mask),
        "clip_frac_high": _masked_mean(((ratio > 1.0 + cfg.epsilon_high) & (adv > 0)).float(), mask),
        "ratio_mean": _masked_mean(ratio.detach(), mask),
        "is_clipped_frac": 0.0,
        "is_masked_frac": 0.0,
    }
    if cfg.tis_cap > 0:
        weight, clipped, masked = off_policy_weights(old_logprobs, batch.rollout_logprobs, mask, cfg)
        per_token = per_token * weight
        metrics["is_clipped_frac"] = _masked_mean(clipped.float(), mask)
        metrics["is_masked_frac"] = _masked_mean(masked.float(), mask)
    return per_token, metrics


def off_policy_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cfg: AlgorithmConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Each token's weight for the mismatch between the learner's old policy and the engine that sampled it, (B, T),
    no gradient; and which tokens the correction clipped and which it masked out, (B, T) bools. w = exp(old -
    rollout) per token; `truncated`: min(w, cap); `masked`: w inside [is_band_low, cap], else 0; `sequence`:
    min(exp(mean over the sequence's tokens of log w), cap), the same for every token of the sequence."""
    log_w = torch.where(mask > 0, old_logprobs - rollout_logprobs, torch.zeros_like(old_logprobs)).detach()  # (B, T)
    none = torch.zeros_like(mask, dtype=torch.bool)
    if cfg.is_correction == "truncated":
        w = torch.exp(log_w)
        return w.clamp(max=cfg.tis_cap), w > cfg.tis_cap, none
    if cfg.is_correction == "masked":
        w = torch.exp(log_w)
        outside = (w < cfg.is_band_low) | (w > cfg.tis_cap)
        return torch.where(outside, torch.zeros_like(w), w), none, outside
    if cfg.is_correction == "sequence":
        log_seq = log_w.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
        w = torch.exp(log_seq).expand_as(log_w)  # (B, T): the sequence's weight on each of its tokens
        return w.clamp(max=cfg.tis_cap), w > cfg.tis_cap, none
    raise ValueError(f"unknown off-policy correction {cfg.is_correction!r}")


def compute_loss(
    logprobs: Tensor,
    entropy: Tensor | None,
    batch: TrainBatch,
    cfg: AlgorithmConfig,
    norm: LossNorm,
    *,
    old_logprobs: Tensor,
    echo_coeff: float,
    echo: EchoConfig | None = None,
    ref_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and its metrics.

    loss = [policy loss + beta * KL] on action tokens (aggregated by `cfg.loss_aggregation`; skipped when
           `echo.only`) + echo_coeff * CE on environment tokens (aggregated by `echo.normalization`).
    The CE reuses `logprobs` (one forward). Truncated samples lose their policy and KL terms with `mask_truncated`
    (DAPO overlong filtering) but stay in the global denominators and keep their ECHO term (their tool
    outputs are real). Metrics are plain floats describing THIS micro-batch alone (means over its tokens, except
    `env_tokens` / `action_tokens`, which are its counts); the learner averages them over micro-batches.
    """
    act = batch.action_mask.float()  # (B, T)
    env = batch.env_mask.float()  # (B, T)
    echo = echo or EchoConfig()
    local = LossNorm.of(act, env, norm.norm_constant, world_size=1)
    zero = logprobs.sum() * 0.0  # keeps the graph connected when a term is empty
    policy, policy_local, kl_local = zero, 0.0, 0.0
    per_token, metrics = _policy_terms(logprobs, batch, cfg, old_logprobs, act)
    if not echo.only:
        keep = act * (~batch.truncated.bool()).float().unsqueeze(1) if cfg.mask_truncated else act  # (B, T)
        policy_local = float(aggregate(per_token.detach(), keep, cfg.loss_aggregation, *_counts(local, "act"), local))
        if cfg.beta > 0:
            if ref_logprobs is None:
                raise ValueError("algorithm.beta > 0 needs ref_logprobs (the reference policy's logprobs)")
            # Outside the action tokens ref := logp (KL 0): prompt/padding values could overflow exp() into NaN.
            ref = torch.where(act > 0, ref_logprobs, logprobs.detach())  # (B, T)
            kl = kl_penalty(logprobs, ref, cfg.kl_estimator)  # (B, T)
            kl_local = _masked_mean(kl.detach(), keep)
            per_token = per_token + cfg.beta * kl
        policy = aggregate(per_token, keep, cfg.loss_aggregation, *_counts(norm, "act"), norm)
    ce = -logprobs  # (B, T): next-token cross-entropy of each environment token
    mode = echo.normalization
    echo_loss = echo_coeff * aggregate(ce, env, mode, *_counts(norm, "env", mode), norm) if echo_coeff else zero
    echo_local = echo_coeff * float(aggregate(ce.detach(), env, mode, *_counts(local, "env", mode), local))
    mismatch = (logprobs.detach() - batch.rollout_logprobs) * act  # (B, T): log pi_learner - log pi_rollout
    metrics.update(
        policy_loss=policy_local,
        kl=kl_local,
        echo_ce=_masked_mean(ce.detach(), env),
        echo_weighted=echo_local,
        echo_policy_ratio=abs(echo_local) / (abs(policy_local) + 1e-8),
        entropy=_masked_mean(entropy, act) if entropy is not None else 0.0,
        mismatch_abs=_masked_mean(mismatch.abs(), act),
        mismatch_kl=_masked_mean(torch.exp(mismatch) - 1.0 - mismatch, act),
        env_tokens=local.env_tokens,
        action_tokens=local.action_tokens,
    )
    return policy + echo_loss, metrics


def _counts(norm: LossNorm, role: str, mode: str = "") -> tuple[float, float]:
    """(tokens, sequences) denominators for the action loss or the env loss under `mode`."""
    if role == "act":
        return norm.action_tokens, norm.sequences
    # ECHO's seq_mean_token_mean averages over the sequences that HAVE env tokens; its sum_norm mode over all
    # sequences.
    return norm.env_tokens, norm.env_sequences if mode == "seq_mean_token_mean" else norm.sequences
