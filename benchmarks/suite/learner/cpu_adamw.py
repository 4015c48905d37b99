"""One AdamW step on a CPU: torch's multi-tensor (foreach) and fused kernels and DeepSpeed's FusedAdam, on one flat
float32 parameter (what ZeRO-1/2 steps), same process, best of `--repeats` after a warm-up step.

    python benchmarks/run.py learner --mode cpu_adamw --params 100e6 --threads 2 --out adamw.json

DeepSpeed's FusedAdam is compiled with g++ on first use in an environment (~40 s on 2 cores, not timed here).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from results_path import with_meta


def time_step(make, n: int, repeats: int) -> float:
    param = torch.nn.Parameter(torch.randn(n))
    param.grad = torch.randn(n)
    opt = make([param])
    opt.step()  # state allocated
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str], prog: str) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    n = int(args.params)
    kw = {"lr": 1e-4, "weight_decay": 0.01}
    results = {
        "torch_foreach_s": time_step(lambda p: torch.optim.AdamW(p, foreach=True, **kw), n, args.repeats),
        "torch_fused_s": time_step(lambda p: torch.optim.AdamW(p, fused=True, **kw), n, args.repeats),
    }
    from deepspeed.ops.adam import FusedAdam

    results["deepspeed_fused_adam_s"] = time_step(lambda p: FusedAdam(p, adam_w_mode=True, **kw), n, args.repeats)
    record = {"params": n, "threads": args.threads, "torch": torch.__version__, **results}
    for name, seconds in results.items():
        print(f"{name:24s} {seconds * 1e3:8.1f} ms")
    if args.out:
        summary = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in results.items())
        with open(args.out, "w") as f:
            json.dump(with_meta(record, f"AdamW step at {n / 1e6:.0f}M params: {summary}"), f, indent=1)
