"""The learner's optimizer on a CPU: torch's fused AdamW (one kernel for the whole update, ~5.7x the multi-tensor
default on 2 cores), under plain torch and under DeepSpeed, and no DeepSpeed op compiled at start
(learner/policy.py, learner/levers/zero.py)."""

from __future__ import annotations

import torch
from builders import as_ray_train_rank_zero

from agentrl_ray.infra.profiles import load_config


def test_fused_adamw_on_a_cpu_updates_as_the_multi_tensor_one():
    """Three AdamW steps with weight decay on float32 parameters (what a CPU learner trains: LoRA adapters, or a
    full model's float32 weights under bfloat16 autocast): the fused CPU kernel the learner now uses gives the
    multi-tensor (previous default) result to float32 rounding."""
    torch.manual_seed(0)
    start = [torch.randn(257, 31), torch.randn(1000)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(3)]
    out = {}
    for fused in (True, False):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=fused or None)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        out[fused] = [p.detach() for p in params]
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(out[True], start))  # it moved
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_cpu_learner_builds_fused_adamw(builtin_model_path, monkeypatch):
    from agentrl_ray.learner.policy import Policy

    as_ray_train_rank_zero(monkeypatch, torch.device("cpu"))
    cfg = load_config(None, ["profile=cpu", "learner.backend=ddp"])
    policy = Policy(builtin_model_path, cfg.model, cfg.learner, need_reference=False)
    assert policy.optimizer.defaults["fused"] is True


def test_deepspeed_on_a_cpu_compiles_no_communication_op():
    """DeepSpeed's communication backend builds its shared-memory all-reduce op (g++, ~30 s on 2 cores, once per
    environment) unless it is marked unavailable, as the learner does: only tensor-parallel inference uses it."""
    import importlib

    from agentrl_ray.learner.levers import zero

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm's `torch` attribute is torch)

    zero._without_inference_comm_op()
    assert ds_torch.build_shm_op() is None  # None: the builder is never asked to load (compile) the op
