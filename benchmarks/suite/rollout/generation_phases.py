"""Prefill and decode of our rollout engine (vLLM CPU, `rollout.vllm_engine.VLLMEngine`), timed apart, at a shape.

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py rollout --mode generation_phases --model qwen05b --prompts 8 --group 8 --decode 32 \
        --out benchmarks/results/generation_phases/05b-<date>-<machine>.json
    python benchmarks/run.py rollout --mode generation_phases --dtype float32 --block-size 128 ...   # vLLM's block
    python benchmarks/run.py rollout --mode generation_phases --sampler vllm ...   # vLLM CPU's own sampler

`prompts` distinct prompts of `--prompt-len` tokens (ids of the built-in tokenizer), each sampled `group` times at
temperature 1 with the learner's seeding, lengths forced (`ignore_eos`). Prefill = `generate(max_tokens=1)` with the
prefix cache emptied first (so each distinct prompt is computed once, the group's copies share it, as in a real
step); decode = `generate(max_tokens=1 + decode)` minus that prefill, per decode iteration. Per-iteration times at
a few hundred tokens of context are dominated by the weights and the MLP, so `--decode 32` extrapolates to 256
tokens by x 256/32 (stated as such in docs/benchmarks.md); the attention share is computed in the roofline.
The process runs with the engine's environment (`vllm_env`, its malloc settings included: it re-executes itself
with them). `prefill_tokens_cached`: the prompt tokens vLLM served from its prefix cache in the prefill call (a
group's copies share the prompt's whole KV blocks: `--block-size`, our CPU engine's 32 unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from results_path import with_meta


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen05b", help="qwen05b (learner --mode qwen05b_shape) or an HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=60)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--block-size", type=int, default=0, help="KV block size (0: the engine's CPU default)")
    p.add_argument("--eager", type=int, default=1, help="vLLM's enforce_eager (0: its torch.compile of the model)")
    p.add_argument(
        "--sampler", choices=("seeded", "vllm"), default="seeded", help="vllm: vLLM CPU's own Gumbel sampler"
    )
    p.add_argument(
        "--profile", type=int, default=0, help="N: then where a decode iteration's time goes, over N (torch.profiler)"
    )
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    from agentrl_ray.rollout import vllm_engine
    from agentrl_ray.rollout.vllm_engine import vllm_env

    env = vllm_env(use_gpu=False)
    if any(os.environ.get(k) != v for k, v in env.items()):
        # glibc reads its malloc settings when a process starts, as the pool starts an engine's process with them.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})
    if a.sampler == "vllm":
        vllm_engine.use_seeded_sampling_on_cpu = lambda: None
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch

    torch.set_num_threads(a.threads)
    if a.model == "qwen05b":
        from suite.learner.qwen05b_shape import ensure_qwen05b_shape

        a.model = str(ensure_qwen05b_shape())
    from agentrl_ray.rollout.vllm_engine import VLLMEngine

    t0 = time.perf_counter()
    engine = VLLMEngine(
        a.model,
        dtype=a.dtype,
        seed=0,
        max_model_len=a.prompt_len + a.decode + 8,
        max_num_seqs=a.prompts * a.group,
        enforce_eager=bool(a.eager),
        gpu_memory_utilization=0.9,
        use_gpu=False,
        kv_cache_bytes=2 * 2**30,
        engine_kwargs={"block_size": a.block_size} if a.block_size else None,
    )
    block_size = engine.llm.llm_engine.vllm_config.cache_config.block_size
    load_s = time.perf_counter() - t0
    rng = random.Random(0)
    distinct = [[rng.randrange(10, 370) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
    prompts = [q for q in distinct for _ in range(a.group)]
    n = len(prompts)

    def run(max_tokens: int) -> float:
        engine.llm.reset_prefix_cache()
        t = time.perf_counter()
        gens = engine.generate(prompts, [max_tokens] * n, temperature=1.0, top_p=1.0, stop_token_ids=[],
                               seeds=list(range(n)), ignore_eos=True)  # fmt: skip
        assert all(len(g.token_ids) == max_tokens for g in gens)
        return time.perf_counter() - t

    run(2)  # warm-up
    prefill = min(run(1) for _ in range(2))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine.llm.reset_prefix_cache()
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=q) for q in prompts], SamplingParams(max_tokens=1))
    cached = sum(o.num_cached_tokens for o in outs)
    total = min(run(1 + a.decode) for _ in range(2))
    decode_iter = (total - prefill) / a.decode
    out = {
        "model": a.model,
        "threads": a.threads,
        "dtype": a.dtype,
        "sequences": n,
        "distinct_prompts": a.prompts,
        "prompt_len": a.prompt_len,
        "load_s": load_s,
        "block_size": block_size,
        "enforce_eager": bool(a.eager),
        "sampler": a.sampler,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "prefill_s": prefill,
        "prefill_tokens_cached": cached,
        # Prefix caching shares a group's prompt only once its blocks are computed: between these two counts.
        "prefill_tokens_at_least": a.prompts * a.prompt_len,
        "prefill_tokens_at_most": n * a.prompt_len,
        "decode_iterations": a.decode,
        "decode_s_per_iteration": decode_iter,
        "decode_tokens_per_s": n / decode_iter,
        "extrapolated_256_decode_s": 256 * decode_iter,
    }
    if a.profile:
        out["profile"] = profile_decode(lambda n: run(1 + n), a.profile)
    summary = (
        f"{n} sequences: prefill {prefill:.2f} s, decode {1e3 * decode_iter:.1f} ms an iteration "
        f"({n / decode_iter:.0f} tokens/s)"
    )
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(with_meta(out, summary), indent=2))


def profile_decode(generate, iterations: int, top: int = 25) -> dict:
    """Where a decode iteration's CPU time goes, by torch operator: each op's self time (its own, not its children's)
    in a generate call of `iterations` decode iterations, less the same op's in a prefill-only call (both profiled),
    per iteration; and the matmuls by input shape. `generate(n)` runs one call of n decode iterations after the
    prefill."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def profiled(n: int):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t0 = time.perf_counter()
            generate(n)
            wall = time.perf_counter() - t0
        by_op = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}
        by_shape = {(e.key, str(e.input_shapes)): (e.self_cpu_time_total, e.count)
                    for e in prof.key_averages(group_by_input_shape=True) if "mm" in e.key}  # fmt: skip
        return wall, by_op, by_shape

    def per_iteration(full: dict, base: dict) -> list[tuple]:
        rows = [(k, (us - base.get(k, (0, 0))[0]) / iterations / 1e3, (n - base.get(k, (0, 0))[1]) / iterations)
                for k, (us, n) in full.items()]  # fmt: skip
        return sorted(rows, key=lambda r: r[1], reverse=True)[:top]

    wall0, ops0, shapes0 = profiled(0)
    wall, ops, shapes = profiled(iterations)
    op_rows = per_iteration(ops, ops0)
    per_iter_ms = (sum(us for us, _ in ops.values()) - sum(us for us, _ in ops0.values())) / iterations / 1e3
    for name, ms, calls in op_rows:
        print(f"{ms:8.2f} ms {calls:7.1f} calls  {name[:80]}")
    return {
        "iterations": iterations,
        "profiled_ms_per_iteration": (wall - wall0) / iterations * 1e3,
        "self_cpu_ms_per_iteration": per_iter_ms,
        "torch_threads": torch.get_num_threads(),
        "ops_ms_per_iteration": [{"op": k, "ms": round(ms, 3), "calls": c} for k, ms, c in op_rows],
        "matmul_shapes_ms_per_iteration": [
            {"op": k[0], "shapes": k[1][:200], "ms": round(ms, 3), "calls": c}
            for k, ms, c in per_iteration(shapes, shapes0)
        ],
    }
