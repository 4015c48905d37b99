"""The two rollout backends side by side on the same model and prompts: tokens/s, and how their log-probs differ
from each other and from the learner's (a teacher-forced `transformers` forward over the same tokens).

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py rollout --mode backend_compare --model qwen05b --dtype bfloat16 \
        --out benchmarks/results/backend_compare/qwen05b-bf16-<date>-<machine>.json
    python benchmarks/run.py rollout --mode backend_compare --model tiny --dtype float32      # the built-in model

Both engines run in this process, one after the other, with the same thread count. Throughput: `--prompts`
distinct prompts of `--prompt-len` token ids, each sampled `--group` times at temperature 1 with per-request seeds,
`--decode` tokens forced (`ignore_eos`): generated tokens per second of one call after a warm-up call (the prompt's
prefill included; vLLM shares a group's prompt through its prefix cache, the torch backend computes it per copy).
Log-probs: greedy decoding of the distinct prompts on both (over the prefix where their tokens agree: mean and max
|delta|), and each backend's sampled log-probs against the learner's forward pass over the same sequences (the
`loss/mismatch_abs` the learner reports in training).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from results_path import with_meta


def learner_logprobs(model_path: str, dtype: str, prompts, gens) -> list[list[float]]:
    """Teacher-forced log-probs of each generation's tokens under `transformers` (the learner's model code)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    out = []
    with torch.no_grad():
        for prompt, gen in zip(prompts, gens):
            ids = torch.tensor([prompt + gen.token_ids])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)  # (T, V)
            pos = range(len(prompt), len(prompt) + len(gen.token_ids))
            out.append([float(logp[p - 1, ids[0, p]]) for p in pos])
    return out


def gaps(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    flat = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return {"mean_abs": sum(flat) / max(1, len(flat)), "max_abs": max(flat, default=0.0), "tokens": len(flat)}


def measure(engine, prompts, group: int, decode: int) -> dict:
    seqs = [p for p in prompts for _ in range(group)]
    kwargs = dict(temperature=1.0, top_p=1.0, stop_token_ids=[], seeds=list(range(len(seqs))), ignore_eos=True)
    engine.generate(seqs[:2], [4, 4], **{**kwargs, "seeds": [0, 1]})  # warm-up
    t0 = time.perf_counter()
    sampled = engine.generate(seqs, [decode] * len(seqs), **kwargs)
    elapsed = time.perf_counter() - t0
    greedy = engine.generate(prompts, [decode] * len(prompts), **{**kwargs, "temperature": 0.0, "seeds": None})
    return {"seqs": seqs, "sampled": sampled, "greedy": greedy, "seconds": elapsed,
            "tokens_per_s": len(seqs) * decode / elapsed}  # fmt: skip


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen05b", help="qwen05b (learner --mode qwen05b_shape), tiny, or an HF folder")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=60)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    from agentrl_ray.rollout.vllm_engine import vllm_env

    os.environ.update(vllm_env(use_gpu=False))
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch

    torch.set_num_threads(a.threads)
    if a.model == "qwen05b":
        from suite.learner.qwen05b_shape import ensure_qwen05b_shape

        a.model = str(ensure_qwen05b_shape())
    elif a.model == "tiny":
        from agentrl_ray.builtin.model import ensure_builtin_model

        a.model = str(ensure_builtin_model())
    from agentrl_ray.rollout.torch_engine import TorchEngine
    from agentrl_ray.rollout.vllm_engine import VLLMEngine

    rng = random.Random(0)
    prompts = [[rng.randrange(10, 370) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
    n, max_len = a.prompts * a.group, a.prompt_len + a.decode + 8
    results = {}
    t0 = time.perf_counter()
    vllm = VLLMEngine(a.model, dtype=a.dtype, seed=0, max_model_len=max_len, max_num_seqs=n, enforce_eager=True,
                      gpu_memory_utilization=0.9, use_gpu=False, kv_cache_bytes=2 * 2**30)  # fmt: skip
    results["vllm"] = {"load_s": time.perf_counter() - t0, **measure(vllm, prompts, a.group, a.decode)}
    del vllm
    t0 = time.perf_counter()
    torch_engine = TorchEngine(a.model, dtype=a.dtype, seed=0, max_model_len=max_len, max_num_seqs=n)
    results["torch"] = {"load_s": time.perf_counter() - t0, **measure(torch_engine, prompts, a.group, a.decode)}
    del torch_engine

    out = {"model": a.model, "dtype": a.dtype, "threads": a.threads, "sequences": n, "prompt_len": a.prompt_len,
           "decode": a.decode}  # fmt: skip
    for name, r in results.items():
        reference = learner_logprobs(a.model, a.dtype, r["seqs"], r["sampled"])
        out[name] = {
            "load_s": round(r["load_s"], 2),
            "generate_s": round(r["seconds"], 2),
            "tokens_per_s": round(r["tokens_per_s"], 1),
            "sampled_vs_learner": gaps([g.logprobs for g in r["sampled"]], reference),
        }
    common = []
    for gv, gt in zip(results["vllm"]["greedy"], results["torch"]["greedy"]):
        k = next((i for i, (x, y) in enumerate(zip(gv.token_ids, gt.token_ids)) if x != y), len(gv.token_ids))
        common.append((gv.logprobs[:k], gt.logprobs[:k], k))
    out["greedy_torch_vs_vllm"] = {
        **gaps([c[0] for c in common], [c[1] for c in common]),
        "prompts_identical": sum(c[2] == a.decode for c in common),
        "prompts": a.prompts,
    }
    out["torch_over_vllm_tokens_per_s"] = round(out["torch"]["tokens_per_s"] / out["vllm"]["tokens_per_s"], 3)
    print(json.dumps(out, indent=2))
    if a.out:
        summary = (
            f"vLLM {out['vllm']['tokens_per_s']} tokens/s, torch {out['torch']['tokens_per_s']} "
            f"({out['torch_over_vllm_tokens_per_s']}x); greedy tokens identical on "
            f"{out['greedy_torch_vs_vllm']['prompts_identical']} of {a.prompts} prompts"
        )
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(with_meta(out, summary), indent=2))
