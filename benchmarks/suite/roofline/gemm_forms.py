"""The learner's matrix products at the 0.5B shape, each computed three ways, interleaved: where this CPU's GEMM
library (oneDNN through `torch.mm`) falls short at a shape and which way of writing the same product gets it back.

    python benchmarks/run.py roofline --mode gemm_forms --out benchmarks/results/gemm_forms/<date>-<machine>.json

For C = A @ B (A: M x K, B: K x N, bfloat16, the learner's threads), with the same numbers out:
- `mm`: torch.mm(A, B), as autograd's linear computes it;
- `transposed`: (B^T @ A^T)^T, made contiguous: the library sees an N x K by K x M product instead;
- `rows`: A in row blocks of `--rows` (what a chunked loop over tokens does).
With `--linear`, the products as a `Linear` layer holds its weight W (N x K, contiguous) instead, at `--tokens` rows:
the forward as `F.linear(x, W)` (`linear`), as (W @ x^T)^T (`linear_t`) and in two halves of rows (`linear_halves`);
the input gradient g @ W as `torch.mm` (`grad`), as (W^T @ g^T)^T (`grad_t`) and in halves (`grad_halves`), for
each of `LINEARS` (docs/benchmarks.md, "oneDNN's row windows on the AMX Xeon").
Shapes (`SHAPES`): the body's projections and their input gradients for a micro-batch of 4 x ~272 tokens, the LoRA
adapters' thin products, and the head's chunks (`learner/levers/chunked_logprobs.py`: 110 tokens of a 151,936-entry
vocabulary on a CPU without AMX; 512 beside them) with their gradients. Each form's GFLOP/s is the median of
`--rounds` interleaved rounds (each round: every form once, best of calls over >= `--min-s`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from results_path import default_out, machine, with_meta

T = 1090  # tokens of a micro-batch of 4 x ~272 at the issue-33 shape
SHAPES = {  # name: (M, K, N)
    "gate_up_forward": (T, 896, 4864),
    "down_forward": (T, 4864, 896),  # also gate/up's input gradient
    "down_input_grad": (T, 896, 4864),
    "attn_out": (T, 896, 896),
    "lora_a_mlp_grad": (4864, T, 16),
    "lora_b_mlp": (T, 16, 4864),
    "head_chunk_forward": (110, 896, 151936),
    "head_chunk_input_grad": (110, 151936, 896),
    "head_forward_512": (512, 896, 151936),
    "head_input_grad_512": (512, 151936, 896),
}

LINEARS = {"down": (896, 4864), "gate_up": (4864, 896), "o": (896, 896), "kv": (128, 896)}  # name: (N, K) of W


def best_time(fn, min_s: float) -> float:
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_s:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return best


def forms(a: torch.Tensor, b: torch.Tensor, rows: int) -> dict:
    bt = b.t().contiguous()  # (N, K): a Linear's weight layout
    return {
        "mm": lambda: torch.mm(a, b),
        "transposed": lambda: torch.mm(bt, a.t()).t().contiguous(),
        "rows": lambda: torch.cat([torch.mm(a[i : i + rows], b) for i in range(0, a.shape[0], rows)]),
    }


def linear_forms(t: int, n: int, k: int) -> dict:
    x, w, g = (torch.randn(*s, dtype=torch.bfloat16) for s in ((t, k), (n, k), (t, n)))
    half = (t + 1) // 2
    return {
        "linear": lambda: torch.nn.functional.linear(x, w),
        "linear_t": lambda: torch.mm(w, x.t()).t().contiguous(),
        "linear_halves": lambda: torch.cat([torch.nn.functional.linear(r, w) for r in x.split(half)]),
        "grad": lambda: torch.mm(g, w),
        "grad_t": lambda: torch.mm(w.t(), g.t()).t().contiguous(),
        "grad_halves": lambda: torch.cat([torch.mm(r, w) for r in g.split(half)]),
    }


def median_rates(fs: dict, rounds: int, min_s: float, flop: int) -> dict:
    times = {f: [] for f in fs}
    for _ in range(rounds):
        for form, fn in fs.items():
            times[form].append(best_time(fn, min_s))
    return {f: round(flop / statistics.median(t) / 1e9, 1) for f, t in times.items()}


def one_line(results: dict) -> str:
    """For the result's meta: the product another form speeds up most, against its plain form (the first)."""
    if not results:
        return "no product measured"

    def gain(name: str) -> float:
        rates = results[name]["gflops"]
        return max(rates.values()) / next(iter(rates.values()))

    name = max(results, key=gain)
    rates = results[name]["gflops"]
    plain, best = next(iter(rates)), max(rates, key=rates.get)
    return f"{len(results)} products; most gained: {name}, {best} {rates[best]:.0f} GFLOP/s, {plain} {rates[plain]:.0f}"


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-s", type=float, default=0.3)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--linear", action="store_true", help="the Linear layouts' forms (LINEARS) instead of SHAPES")
    p.add_argument("--tokens", type=int, default=T, help="M of --linear")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from agentrl_ray.infra.hardware import this_cpu

    cpu = this_cpu()
    print(f"{cpu.model}, AMX {cpu.amx}, torch {torch.__version__}, {a.threads} threads")
    results = {}
    for name, (n, k) in LINEARS.items() if a.linear else ():
        fs = linear_forms(a.tokens, n, k)
        for form, fn in fs.items():  # the same numbers every way, to bfloat16 rounding
            ref = fs["grad" if form.startswith("grad") else "linear"]().float()
            err = (fn().float() - ref).abs().max().item() / ref.abs().max().item()
            assert err < 2e-2, f"{name} {form}: relative error {err}"
        rates = median_rates(fs, a.rounds, a.min_s, 2 * a.tokens * n * k)
        results[name] = {"m": a.tokens, "n": n, "k": k, "weight": [n, k], "gflops": rates}
        shown = "  ".join(f"{f} {r:7.1f}" for f, r in rates.items())
        print(f"{name:10s} W {n:5d} x {k:5d}, {a.tokens} tokens  {shown}")
    for name in a.shapes.split(",") if not a.linear else ():
        m, k, n = SHAPES[name]
        x, y = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
        fs = forms(x, y, a.rows)
        ref = fs["mm"]().float()
        for form, fn in fs.items():  # the same product, to bfloat16 rounding of the accumulation order
            err = (fn().float() - ref).abs().max().item() / ref.abs().max().item()
            assert err < 2e-2, f"{name} {form}: relative error {err}"
        rates = median_rates(fs, a.rounds, a.min_s, 2 * m * k * n)
        results[name] = {"m": m, "k": k, "n": n, "gflops": rates}
        print(f"{name:24s} {m:6d} x {k:6d} x {n:6d}  " + "  ".join(f"{f} {r:7.1f}" for f, r in rates.items()))
    out = a.out or default_out("gemm_forms")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu.model, "tag": machine(), "isa": cpu.isa}
    result = {"machine": record, "threads": a.threads, "torch": torch.__version__,
              "rounds": a.rounds, "linear": a.linear, "results": results}  # fmt: skip
    out.write_text(json.dumps(with_meta(result, one_line(results)), indent=2))
    print(f"wrote {out}")
