"""A non-finite loss or gradient never reaches the weights: the optimizer step is skipped (the last good weights are
kept and synced again), the skip is counted in the step's metrics (`loss/skipped_nonfinite`), and
`learner.max_nonfinite_steps` consecutive steps with a skip stop the run with a message saying so.

Every rank takes the same decision (a MIN all-reduce of the flag): one rank stepping while another skips would put
data-parallel replicas out of step. Under DeepSpeed the gradients live in the engine's own buffers, which it offers
no way to discard, so a non-finite step there stops the run at once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from agentrl_ray.types import RunStopped

ONE_NORM_CHECK = True


def step_is_finite(policy, losses_finite: bool) -> bool:
    """True when this rank's losses and the (already all-reduced) gradients are finite, on every rank.

    The gradients are checked through their total norm, which is NaN or inf exactly when one of them holds a NaN or
    an inf (or when the norm itself overflows float32, above ~1.8e19: a step no one wants either). That is one
    multi-tensor reduction and one host sync; a check per tensor was two kernels and a sync for each of a LoRA
    model's hundreds of adapter tensors (`ONE_NORM_CHECK`, which `benchmarks/run.py learner`'s `-gradcheck`
    turns off)."""
    grads = [p.grad for p in policy.module.parameters() if p.grad is not None]
    if not losses_finite or not grads:
        ok = losses_finite
    elif ONE_NORM_CHECK:
        ok = bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))
    else:
        ok = all(bool(torch.isfinite(g).all()) for g in grads)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([1.0 if ok else 0.0], device=policy.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = bool(flag.item() > 0)
    return ok


def skip_step(policy, step: int) -> None:
    """Drop this step's gradients without touching the weights or the optimizer state."""
    if policy.engine is not None:
        raise RunStopped(
            f"step {step}: the loss or the gradients are NaN/inf, and a DeepSpeed step cannot be skipped: stopping "
            "with the last checkpoint's weights intact (lower learner.lr, check rewards and learner.max_grad_norm)"
        )
    policy.optimizer.zero_grad(set_to_none=True)


def check_consecutive(skipped_in_a_row: int, limit: int, step: int) -> None:
    if skipped_in_a_row >= limit:
        raise RunStopped(
            f"step {step}: {skipped_in_a_row} steps in a row had a NaN/inf loss or gradient "
            f"(learner.max_nonfinite_steps={limit}); every update was skipped, the weights are those before the "
            "first of them. Stopping: lower learner.lr, check the rewards, or raise learner.max_nonfinite_steps"
        )
