"""The packed micro-batch's masked attention on a CPU: SDPA's flash kernel against `learner/cpu_attention.py`'s GEMMs.

    python benchmarks/cpu_attention.py --out benchmarks/results/issue33-round12/cpu_attention-epyc.json

One call is one decoder layer's attention of the remainders of a packed micro-batch (learner/shared_prefix.py): at
the 0.5B side-by-side's shape 4 rows of 256 sampled tokens on a 58-token prompt, 14 query heads on 2 key/value heads
of 64, bfloat16, so queries (4, 14, 256, 64) on keys and values (4, 2, 314, 64) with the prefix-plus-causal mask.
The process runs with a CPU learner's malloc settings (it re-executes itself with them, as a run starts its learner:
infra/allocator.py; under glibc's defaults every call faults its score buffers in again). Times forward alone and
forward plus backward, `--calls` calls a round (24: one micro-batch's layers), `--rounds` rounds alternating the two
kernels; reports each round's ms per call, and the largest error of each against a float32 SDPA reference (output
and gradients, relative to the reference's largest magnitude)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=58)
    p.add_argument("--own", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    from agentrl_ray.infra.allocator import allocator_env

    env = allocator_env(one_arena=False)
    if any(os.environ.get(k) != v for k, v in env.items()):  # glibc reads them when the process starts
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})
    import torch

    from agentrl_ray.learner.cpu_attention import attend

    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(a.rows, a.heads, a.own, a.dim, generator=g)
    k = torch.randn(a.rows, a.kv_heads, a.prefix + a.own, a.dim, generator=g)
    v = torch.randn(a.rows, a.kv_heads, a.prefix + a.own, a.dim, generator=g)
    grad = torch.randn(a.rows, a.heads, a.own, a.dim, generator=g)
    own = torch.ones(a.own, a.own, dtype=torch.bool).tril()
    allowed = torch.cat([torch.ones(a.own, a.prefix, dtype=torch.bool), own], dim=1)
    scale = a.dim**-0.5
    kernels = {
        "flash": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True
        ),
        "gemm": lambda q, k, v: attend(q, k, v, allowed, scale),
    }

    def values(fn, dtype):
        tensors = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out = fn(*tensors)
        out.backward(grad.to(dtype))
        return [out.detach().float(), *(t.grad.float() for t in tensors)]

    exact = values(kernels["flash"], torch.float32)
    errors = {}
    for name, fn in kernels.items():
        got = values(fn, torch.bfloat16)
        parts = zip(("out", "dq", "dk", "dv"), got, exact)
        errors[name] = {part: float((x - y).abs().max() / y.abs().max()) for part, x, y in parts}
    tensors = [x.detach().to(torch.bfloat16).requires_grad_() for x in (q, k, v)]
    dout = grad.to(torch.bfloat16)
    times = {name: {"forward_ms": [], "forward_backward_ms": []} for name in kernels}
    for _ in range(a.rounds):
        for name, fn in kernels.items():
            fn(*tensors).backward(dout)  # warm
            forward = 0.0
            t0 = time.perf_counter()
            for _ in range(a.calls):
                t1 = time.perf_counter()
                out = fn(*tensors)
                forward += time.perf_counter() - t1
                out.backward(dout)
            total = time.perf_counter() - t0
            times[name]["forward_ms"].append(round(1e3 * forward / a.calls, 3))
            times[name]["forward_backward_ms"].append(round(1e3 * total / a.calls, 3))
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    result = {"shape": vars(a) | {"out": None}, "torch": torch.__version__, "malloc_env": malloc, "times": times}
    result["errors_bf16"] = errors
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
