"""The NaN/inf guard of the learner's update (agentrl_ray/learner/guards.py) on a real torch model and optimizer.

No Ray: the guard takes the policy's module, optimizer and device; a stand-in holds a real model and AdamW (the
learner's Policy needs a Ray Train worker). The all-reduce branch runs only with more than one rank.
"""

from __future__ import annotations

import pytest
import torch

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner import guards


class TinyPolicy:
    def __init__(self):
        torch.manual_seed(0)
        self.module = torch.nn.Linear(4, 2)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=0.1)
        self.device = torch.device("cpu")
        self.engine = None


def one_step(policy: TinyPolicy, scale: float) -> bool:
    """Backward of a loss times `scale` (inf/nan poison it), then step unless the guard says skip."""
    loss = policy.module(torch.ones(3, 4)).sum() * scale
    loss.backward()
    if not guards.step_is_finite(policy, bool(torch.isfinite(loss))):
        guards.skip_step(policy, step=7)
        return False
    policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    return True


def snapshot(policy: TinyPolicy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.module.parameters()]


def test_nan_and_inf_losses_skip_the_step_and_keep_the_weights():
    policy = TinyPolicy()
    before = snapshot(policy)
    for poison in (float("nan"), float("inf")):
        assert one_step(policy, poison) is False
        assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy)))
        assert all(p.grad is None for p in policy.module.parameters())  # dropped, not carried into the next step
        assert policy.optimizer.state == {}  # AdamW's moments never saw the poison
    assert one_step(policy, 1.0) is True  # a good step afterwards trains as usual
    assert not all(torch.equal(a, b) for a, b in zip(before, snapshot(policy)))
    assert all(torch.isfinite(p).all() for p in policy.module.parameters())


def test_finite_loss_with_nonfinite_gradients_is_caught_too():
    policy = TinyPolicy()
    policy.module.weight.register_hook(lambda g: g * float("inf"))
    assert one_step(policy, 1.0) is False


def test_deepspeed_cannot_skip_and_says_so():
    policy = TinyPolicy()
    policy.engine = object()
    with pytest.raises(RuntimeError, match="step 7: the loss or the gradients are NaN/inf, and a DeepSpeed step"):
        guards.skip_step(policy, step=7)


def test_consecutive_skips_stop_the_run_clearly():
    guards.check_consecutive(2, 3, step=10)
    with pytest.raises(RuntimeError, match=r"step 11: 3 steps in a row .*\(learner.max_nonfinite_steps=3\)"):
        guards.check_consecutive(3, 3, step=11)
    with pytest.raises(ConfigError, match="learner.max_nonfinite_steps must be at least 1"):
        load_config(overrides=["learner.max_nonfinite_steps=0"])


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf"), None])
def test_the_one_norm_check_agrees_with_a_check_per_tensor(poison, monkeypatch):
    """The guard reads the gradients through one total norm (one host sync); a NaN or inf in any one of many
    tensors, of either dtype, is caught as the check per tensor catches it, and clean gradients pass both."""

    class ManyGrads:
        def __init__(self):
            g = torch.Generator().manual_seed(1)
            self.module = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(5, 3, generator=g).to(dtype)) for dtype in [torch.float32] * 40]
                + [torch.nn.Parameter(torch.randn(7, generator=g).to(torch.bfloat16)) for _ in range(20)]
            )
            for p in self.module:
                p.grad = torch.randn_like(p) * 1e3
            if poison is not None:
                self.module[45].grad[3] = poison  # one bfloat16 tensor, one element
            self.device = torch.device("cpu")

    policy = ManyGrads()
    monkeypatch.setattr(guards, "ONE_NORM_CHECK", True)
    one = guards.step_is_finite(policy, True)
    monkeypatch.setattr(guards, "ONE_NORM_CHECK", False)
    each = guards.step_is_finite(policy, True)
    assert one == each == (poison is None)
    assert guards.step_is_finite(policy, False) is False  # a non-finite loss decides alone
