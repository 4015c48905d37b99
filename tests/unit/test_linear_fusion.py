"""learner/levers/linear_fusion.py: a compiled graph's linears that read the same input run as one matmul, with the same
outputs and gradients as the separate calls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from agentrl_ray.learner.levers import compilation, linear_fusion
from agentrl_ray.learner.levers.compilation import compile_layers
from agentrl_ray.learner.levers.linear_fusion import FuseSharedInputLinears

sys.path.insert(0, str(Path(__file__).parent))
from test_learner_compile import _assert_same_logprobs_and_grads, _lora_model  # noqa: E402


class Block(torch.nn.Module):
    """q/k/v-like linears with biases on one input, two bias-free ones on it, one on another input, and one whose
    output is written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4), torch.nn.Linear(16, 4)
        self.gate, self.up = torch.nn.Linear(16, 24, bias=False), torch.nn.Linear(16, 24, bias=False)
        self.other = torch.nn.Linear(24, 16, bias=False)
        self.written = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.q(x) + torch.cat([self.k(x), self.v(x)], dim=-1).repeat(1, 1, 2)
        h = self.other(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        w = self.written(x)
        w.mul_(2.0)  # in place: this linear stays alone
        return a + h + w.repeat(1, 1, 2)


@pytest.fixture(autouse=True)
def _no_compiled_graph_caches():
    """Inductor's on-disk caches off: a graph found there (compiled with this pass by an earlier test or run) does
    not run the pass again, and these tests count its calls."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


def _counting(monkeypatch) -> list[tuple[int, int, int]]:
    """Each call of the pass as (groups fused, linear calls before, after)."""
    seen = []
    fuse = linear_fusion.fuse_shared_input_linears

    def spy(graph):
        count = lambda: sum(n.op == "call_function" and n.target in linear_fusion._LINEARS for n in graph.nodes)  # noqa: E731
        before = count()
        fused = fuse(graph)
        seen.append((fused, before, count()))
        return fused

    monkeypatch.setattr(linear_fusion, "fuse_shared_input_linears", spy)
    return seen


def _outputs_and_grads(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out = module(x)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    grads["input"] = x.grad
    return out.detach(), grads


def test_linears_sharing_an_input_fuse_and_compute_the_same(monkeypatch):
    torch.manual_seed(0)
    eager = Block()
    fused = Block()
    fused.load_state_dict(eager.state_dict())
    seen = _counting(monkeypatch)
    fused.compile(dynamic=True, options={"pre_grad_custom_pass": FuseSharedInputLinears()})  # names unchanged
    for shape in [(2, 5, 16), (3, 7, 16)]:
        x = torch.randn(shape)
        want_out, want_grads = _outputs_and_grads(eager, x)
        got_out, got_grads = _outputs_and_grads(fused, x)
        torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
        assert got_grads.keys() == want_grads.keys()
        for name, want in want_grads.items():
            torch.testing.assert_close(got_grads[name], want, rtol=1e-5, atol=1e-5, msg=name)
    # q/k/v into one, gate/up into one; `other` (another input) and `written` (written in place) left alone
    assert seen and seen[0] == (2, 7, 4)


def test_linears_of_different_dtypes_fuse_only_with_their_own(monkeypatch):
    """A bfloat16 base beside float32 adapters (the learner's LoRA under autocast): each dtype fuses apart."""
    torch.manual_seed(0)
    base = [torch.nn.Linear(16, n, bias=False).to(torch.bfloat16) for n in (16, 4, 4)]
    adapters = [torch.nn.Linear(16, 2, bias=False) for _ in range(3)]
    layers = torch.nn.ModuleList(base + adapters)

    def forward(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.cat([m(x) for m in layers], dim=-1)

    seen = _counting(monkeypatch)
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16)
    got = torch.compile(forward, options={"pre_grad_custom_pass": FuseSharedInputLinears()})(x)
    torch.testing.assert_close(got, forward(x), rtol=1e-2, atol=1e-2)
    assert seen[0] == (2, 6, 2)


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_compiled_lora_layers_fuse_their_projections_and_match_eager(builtin_model_path, monkeypatch):
    """The learner's compiled LoRA layer with the fusion on: q/k/v, their three adapters' A, o with its A, gate/up
    with their A's, down with its A (float32: one dtype) become 5 matmuls' groups, 21 linear calls 12; log-probs and
    gradients equal the eager model's (off, the layers compile as tests/unit/test_learner_compile.py checks)."""
    seen = _counting(monkeypatch)
    assert not compilation.FUSE_SHARED_INPUT_LINEARS  # off until a GPU measures it
    assert "options" not in compilation.layer_compile_options()
    monkeypatch.setattr(compilation, "FUSE_SHARED_INPUT_LINEARS", True)
    eager, fused = _lora_model(builtin_model_path), _lora_model(builtin_model_path)
    compile_layers(fused, torch.device("cpu"))
    ids = torch.randint(10, 300, (3, 37), generator=torch.Generator().manual_seed(1))
    _assert_same_logprobs_and_grads(eager, fused, ids)
    # every graph dynamo made of the layers (the first layer's and the others', which it guards apart) was fused
    assert seen and all(s == (5, 21, 12) for s in seen)


def test_linears_on_either_side_of_autocast_or_no_grad_stay_apart(monkeypatch):
    """Where autocast or grad mode switches between two linears of one input they compute differently: no fusion."""
    torch.manual_seed(0)
    a, b, c = (torch.nn.Linear(8, 8) for _ in range(3))

    def forward(x):
        y = a(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = b(x)
        with torch.no_grad():
            w = c(x)
        return y + z.float() + w

    seen = _counting(monkeypatch)
    x = torch.randn(2, 8)
    got = torch.compile(forward, options={"pre_grad_custom_pass": FuseSharedInputLinears()})(x)
    torch.testing.assert_close(got, forward(x))
    assert seen[0] == (0, 3, 3)
