"""Linears that read the same input, fused into one matmul inside each compiled decoder layer.

A Hugging Face decoder layer calls its q, k and v projections on the same normed hidden states, and its gate and up
projections on the same input again; under LoRA each of those also runs its adapter's A on that input. Inductor
keeps every such call a kernel of its own, forward and backward: at 0.5B a LoRA step launches 1,317 matmuls against
the full fine-tune's 517, and on a GPU that step waits on the host (docs/history/learner_speed.md, round 3). This pass,
run by inductor on each layer's graph before autograd is traced, replaces each set of `linear(x, W_i, b_i)` that
share `x` with one `linear(x, cat(W_i), cat(b_i))` whose output is split back: one matmul for the forward, one for
the input's gradient and one for the weights' (then sliced). Parameter names, state dicts and PEFT's modules are
untouched: the graph changes, not the model.

The concatenated weight is built at each call (a copy of the group's weights, ~2 MB for 0.5B's q/k/v in bfloat16);
the result equals the separate calls up to the order of float sums (the input's gradient is summed inside one GEMM
instead of over several).
"""

from __future__ import annotations

import hashlib
import operator
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

_LINEARS = (torch._C._nn.linear, torch.nn.functional.linear)


class FuseSharedInputLinears(CustomGraphPass):
    """Inductor's `pre_grad_custom_pass`: fuses, in each graph it is given, the linears that share an input
    (`fuse_shared_input_linears`). `groups_fused` counts the groups over every graph it has seen."""

    def __init__(self) -> None:
        self.groups_fused = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.groups_fused += fuse_shared_input_linears(graph)

    def uuid(self) -> str:
        # inductor's graph cache keys compiled code by this: the pass's own source
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def fuse_shared_input_linears(graph: torch.fx.Graph) -> int:
    """Fuses each set of two or more fusible linear calls on the same input node (with biases, or all without) into
    one; returns how many sets were fused."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    groups: dict[tuple, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        args = _linear_args(node)
        if args is None:
            continue
        x, w, b = args
        if _fusible(node, w, b):
            value = w.meta["example_value"]
            groups.setdefault((x, b is None, value.dtype, value.device), []).append(node)
    # where autocast or grad mode switch: linears on either side of one compute differently, and stay apart
    switches = [order[n] for n in graph.nodes if n.op == "call_function" and _switches_mode(n.target)]
    fused = 0
    for (x, no_bias, _, _), nodes in groups.items():
        # the fused call goes where the first of them was: every weight and bias must be defined by then
        params = [p for n in nodes for p in _linear_args(n)[1:] if p is not None]
        first, last = order[nodes[0]], order[nodes[-1]]
        if len(nodes) > 1 and all(order[p] < first for p in params) and not any(first < i < last for i in switches):
            _fuse(graph, x, nodes, no_bias)
            fused += 1
    return fused


def _switches_mode(target) -> bool:
    """Autocast's enter/exit or a grad-mode change, as Torch IR records them."""
    name = getattr(target, "__name__", "")
    return name in ("_enter_autocast", "_exit_autocast", "_set_grad_enabled") or "autocast" in name


def _linear_args(node: torch.fx.Node) -> tuple | None:
    """(input, weight, bias) of a `linear` call in Torch IR, however its arguments were passed; None otherwise."""
    if node.op != "call_function" or node.target not in _LINEARS:
        return None
    names = ("input", "weight", "bias")
    values = list(node.args) + [None] * (3 - len(node.args))
    for i, name in enumerate(names):
        if name in node.kwargs:
            values[i] = node.kwargs[name]
    x, w, b = values
    if not isinstance(x, torch.fx.Node) or not isinstance(w, torch.fx.Node):
        return None
    if b is not None and not isinstance(b, torch.fx.Node):
        return None
    return x, w, b


def _fusible(node: torch.fx.Node, weight: torch.fx.Node, bias: torch.fx.Node | None) -> bool:
    """A linear whose weight (and bias) are graph inputs or attributes (not computed in the graph), with a 2-D
    weight, traced values to check that by, and no caller writing into its output in place (the output becomes a
    view of the fused one)."""
    for p in (weight, bias):
        if p is None:
            continue
        if p.op not in ("placeholder", "get_attr") or not isinstance(p.meta.get("example_value"), torch.Tensor):
            return False
    if weight.meta["example_value"].dim() != 2 or not isinstance(node.meta.get("example_value"), torch.Tensor):
        return False
    return not any(_writes_in_place(user.target) for user in node.users)


def _writes_in_place(target) -> bool:
    """An in-place method or function (`add_`, `operator.iadd`) in Torch IR."""
    name = getattr(target, "__name__", str(target))
    return (
        name.endswith("_")
        and not name.endswith("__")
        or getattr(target, "__module__", "") == "_operator"
        and (name.startswith("i"))
    )


def _fuse(graph: torch.fx.Graph, x: torch.fx.Node, nodes: list[torch.fx.Node], no_bias: bool) -> None:
    """One linear on the concatenated weights (and biases) before the first of `nodes`, its output split back."""
    weights = [_linear_args(n)[1] for n in nodes]
    biases = [] if no_bias else [_linear_args(n)[2] for n in nodes]
    sizes = [int(w.meta["example_value"].shape[0]) for w in weights]
    with graph.inserting_before(nodes[0]):
        w = graph.call_function(torch.cat, (weights,), {"dim": 0})
        w.meta["example_value"] = torch.cat([p.meta["example_value"] for p in weights], dim=0)
        b = None
        if biases:
            b = graph.call_function(torch.cat, (biases,), {"dim": 0})
            b.meta["example_value"] = torch.cat([p.meta["example_value"] for p in biases], dim=0)
        y = graph.call_function(torch._C._nn.linear, (x, w, b))
        # the traced values of the calls it replaces (autocast's dtype included), side by side
        y.meta["example_value"] = torch.cat([n.meta["example_value"] for n in nodes], dim=-1)
        parts = graph.call_function(torch.split, (y, sizes), {"dim": -1})
        parts.meta["example_value"] = tuple(n.meta["example_value"] for n in nodes)
        outs = []
        for i, node in enumerate(nodes):
            out = graph.call_function(operator.getitem, (parts, i))
            out.meta.update(node.meta)
            outs.append(out)
    for node, out in zip(nodes, outs):
        node.replace_all_uses_with(out)
        graph.erase_node(node)
