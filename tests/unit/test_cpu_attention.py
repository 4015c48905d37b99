"""`learner/levers/cpu_attention.py`: the packed micro-batch's masked attention as GEMMs on a CPU. It must be SDPA's
attention (float32: to rounding; bfloat16: within bfloat16's rounding of the float32 result), its gradients
included, and a well-formed custom op (fake tensors, autograd) so that compiled layers call it."""

from __future__ import annotations

import torch

from agentrl_ray.learner.levers.cpu_attention import attend, masked_attention


def _inputs(dtype, rows=3, heads=4, kv_heads=2, prefix=5, own=7, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, own, dim, generator=g)
    k = torch.randn(rows, kv_heads, prefix + own, dim, generator=g)
    v = torch.randn(rows, kv_heads, prefix + own, dim, generator=g)
    allowed = torch.cat([torch.ones(own, prefix, dtype=torch.bool), torch.ones(own, own, dtype=torch.bool).tril()], 1)
    grad = torch.randn(rows, heads, own, dim, generator=g)
    return [x.to(dtype).requires_grad_() for x in (q, k, v)], allowed, grad.to(dtype)


def _run(fn, tensors, grad):
    out = fn(*tensors)
    out.backward(grad)
    return [out.detach().float(), *(t.grad.float() for t in tensors)]


def _sdpa(allowed, scale):
    return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True
    )


def test_float32_gives_sdpas_output_and_gradients():
    (q, k, v), allowed, grad = _inputs(torch.float32)
    scale = 0.3
    got = _run(lambda *t: attend(*t, allowed, scale), [q, k, v], grad)
    want = _run(_sdpa(allowed, scale), [x.detach().clone().requires_grad_() for x in (q, k, v)], grad)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


def test_bfloat16_stays_within_bfloat16_rounding_of_float32():
    (q, k, v), allowed, grad = _inputs(torch.bfloat16, prefix=20, own=40, dim=64)
    scale = 64**-0.5
    got = _run(lambda *t: attend(*t, allowed, scale), [q, k, v], grad)
    exact = _run(_sdpa(allowed, scale), [x.detach().float().requires_grad_() for x in (q, k, v)], grad.float())
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, exact):
        assert (g - w).abs().max() <= 0.02 * w.abs().max(), name


def test_the_custom_op_is_well_formed_for_compiled_layers():
    """Schema, fake tensors, autograd registration (torch.library.opcheck), and a compiled caller with dynamic
    shapes: two lengths through one graph, the eager values."""
    (q, k, v), allowed, grad = _inputs(torch.float32)
    torch.library.opcheck(masked_attention, (q, k, v, allowed, 0.25))

    compiled = torch.compile(lambda q, k, v, a: attend(q * 1.0, k, v, a, 0.25) * 2.0, dynamic=True, fullgraph=True)
    for own in (7, 9):
        tensors, allowed, grad = _inputs(torch.float32, own=own, seed=own)
        got = _run(lambda *t, a=allowed: compiled(*t, a), tensors, grad)
        want = _run(
            lambda q, k, v, a=allowed: attend(q, k, v, a, 0.25) * 2.0,
            [x.detach().clone().requires_grad_() for x in tensors],
            grad,
        )
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_under_cpu_autocast_it_computes_in_autocasts_dtype_as_sdpa_does():
    """A float32 model under `learner.bf16` (bfloat16 autocast): forward and backward in bfloat16, compiled too,
    the float32 inputs' gradients close to SDPA's under the same autocast."""
    (q, k, v), allowed, grad = _inputs(torch.float32, prefix=20, own=40, dim=64)
    scale = 64**-0.5
    compiled = torch.compile(lambda q, k, v: attend(q, k, v, allowed, scale), dynamic=True, fullgraph=True)
    for fn in (lambda q, k, v: attend(q, k, v, allowed, scale), compiled):
        tensors = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(*tensors)
        assert out.dtype == torch.bfloat16
        out.float().backward(grad)
        got = [out.detach().float(), *(t.grad for t in tensors)]
        assert all(t.grad.dtype == torch.float32 for t in tensors)
        exact = _run(_sdpa(allowed, scale), [x.detach().clone().requires_grad_() for x in (q, k, v)], grad)
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, exact):
            assert (g - w).abs().max() <= 0.03 * w.abs().max(), name
