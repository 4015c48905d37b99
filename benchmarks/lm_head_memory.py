"""Peak memory and time of the learner's log-probabilities at a real vocabulary: full logits against chunked.

    python benchmarks/lm_head_memory.py                         # hidden 896, vocab 151936 (Qwen2.5-0.5B), 2048 tokens
    python benchmarks/lm_head_memory.py --tokens 4096 --threads 2 --out benchmarks/results/lm_head_memory.json

Forward + backward of the per-token log-probabilities (and the no-grad entropy) of N tokens from the last hidden
states (N, H) through a frozen tied head (V, H), as the learner does with LoRA and `learner.bf16` (float32 weights,
bfloat16 autocast):
- `full`: the head's full (B, T, V) logits (bf16 under autocast), then `learner.logprobs.token_logprobs_and_entropy`
  (already float32 math in chunks of positions, no float32 copy kept for backward): what the learner did before
  `learner.chunked_logprobs`;
- `full_fp32`: the same with float32 logits (no autocast): what a float32 learner does;
- `chunked`: `chunked_logprobs.hidden_token_logprobs` (logits of ~110 tokens at a time, recomputed in backward);
- `chunked_big`: the same with 4x larger chunks (~441 tokens, 2^26 logits).
Each variant runs in its own subprocess; peak memory is that process's peak RSS (ru_maxrss) less its RSS after the
inputs were built. Time is the best of `--repeats` forward+backward passes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("full", "full_fp32", "chunked", "chunked_big")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one(variant: str, tokens: int, hidden: int, vocab: int, threads: int, repeats: int) -> dict:
    import os

    import torch

    from agentrl_ray.learner.chunked_logprobs import chunk_tokens_for, hidden_token_logprobs
    from agentrl_ray.learner.logprobs import token_logprobs_and_entropy

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    seq = 256
    h = torch.randn(tokens // seq, seq, hidden, requires_grad=True)  # (B, T, H) float32, as the residual stream
    w = torch.randn(vocab, hidden) * 0.02  # frozen head (LoRA), float32 master weights
    ids = torch.randint(0, vocab, (tokens // seq, seq))
    autocast = variant != "full_fp32"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if variant.startswith("chunked"):
                chunk = chunk_tokens_for(vocab, 1 << 26) if variant == "chunked_big" else None
                logp, ent = hidden_token_logprobs(h, w, ids, chunk=chunk)
            else:
                logp, ent = token_logprobs_and_entropy(h @ w.T, ids)
        logp.sum().backward()
        h.grad = None

    base = rss_mib()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    head_flops = 2 * tokens * hidden * vocab  # one (N, H) x (H, V) matmul
    passes = 3 if variant.startswith("chunked") else 2  # chunked recomputes the logits in backward
    return {
        "variant": variant,
        "load_average_1min": os.getloadavg()[0],  # other work on the shared machine
        "tokens": tokens,
        "hidden": hidden,
        "vocab": vocab,
        "threads": threads,
        "peak_extra_mib": peak - base,
        "best_s": min(times),
        "times_s": times,
        "head_matmuls": passes,
        "gflop": passes * head_flops / 1e9,
        "achieved_gflops": passes * head_flops / 1e9 / min(times),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.tokens, a.hidden, a.vocab, a.threads, a.repeats)))
        return
    rows = []
    for v in a.variants.split(","):
        cmd = [sys.executable, __file__, "--one", v] + [f"--{k}={getattr(a, k)}" for k in ("tokens", "hidden", "vocab")]
        cmd += [f"--threads={a.threads}", f"--repeats={a.repeats}"]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            rows.append({"variant": v, "error": res.stderr.strip().splitlines()[-1:]})
            print(f"{v}: failed: {res.stderr[-400:]}")
            continue
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print("| variant | tokens | peak extra MiB | best s (fwd+bwd) | head GFLOP | GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" not in r:
            print(
                f"| {r['variant']} | {r['tokens']} | {r['peak_extra_mib']:.0f} | {r['best_s']:.2f} | {r['gflop']:.0f} "
                f"| {r['achieved_gflops']:.0f} |"
            )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
