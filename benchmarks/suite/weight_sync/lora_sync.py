"""LoRA weight sync on the engine side: merged into a copy of the base weights (`rollout.lora_mode=merge`, the CPU
default) vs vLLM's own LoRA (`native`, the GPU default), on vLLM CPU. Per version: the time from push to every engine
holding it (flush), then greedy generation speed with the adapter in place. Results go to docs/scaling.md.

    python benchmarks/run.py weight_sync --mode lora_sync             # the built-in model, r=16 on every projection
    python benchmarks/run.py weight_sync --mode lora_sync --model /path/to/model --rank 16 --versions 3 --out x.json
    python benchmarks/run.py weight_sync --mode lora_sync --model qwen05b --dtype bfloat16 --modes merge   # 0.5B shape

Reports the engine process's resident memory and its peak (VmHWM) after the updates, and the greedy speed of the
freshly built engine before any update (after one warm-up generation) to compare the speeds after each update with,
and the engine's minor page faults per generated token during each of those generations (agentrl_ray/allocator.py:
`AGENTRL_KEEP_FREED_MEMORY=0` runs the engine with glibc's default allocator settings, for an A/B).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from results_path import with_meta


def peak_rss_gib(pid: int) -> dict[str, float]:
    """The process's resident memory now and its high-water mark (VmHWM: the peak since it started)."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {k: int(re.search(rf"{k}:\s+(\d+)", status).group(1)) for k in ("VmRSS", "VmHWM")}
    return {"rss_gib": round(kib["VmRSS"] / 2**20, 3), "peak_rss_gib": round(kib["VmHWM"] / 2**20, 3)}


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (/proc/PID/stat, field 10)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def measure(
    mode: str, model_path: str, rank: int, versions: int, prompts: int, tokens: int, dtype: str = "float32"
) -> dict:
    import ray
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentrl_ray.infra.allocator import allocator_env
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.policy import lora_tensors
    from agentrl_ray.rollout.pool import RolloutPool
    from agentrl_ray.sync.sender import ObjectStoreSender

    overrides = [
        "profile=lora",
        f"rollout.lora_mode={mode}",
        f"learner.lora.r={rank}",
        f"learner.lora.alpha={2 * rank}",
    ]
    cfg = load_config(None, [*overrides, f"model.dtype={dtype}", "rollout.num_cpus_per_worker=1"])
    pool = RolloutPool.create(cfg, model_path)
    try:
        pid = ray.get(pool.workers[0].pid.remote())
        started = peak_rss_gib(pid)  # the engine built, before any update
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=cfg.learner.lora.target_modules)
        model = get_peft_model(base, lora)
        sync = ObjectStoreSender(lora_scaling=2.0)
        sync.setup(pool.workers)
        prompt = list(range(10, 50))
        flush, gen = [], []
        pool.greedy([prompt] * prompts, tokens)  # warm-up: an engine's first generation is slower
        f0, t0 = minor_faults(pid), time.perf_counter()
        pool.greedy([prompt] * prompts, tokens)  # the built weights, before any update: the reference speed
        before = prompts * tokens / (time.perf_counter() - t0)
        faults = [(minor_faults(pid) - f0) / (prompts * tokens)]
        for version in range(1, versions + 1):
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.01)
            sync.push(lora_tensors(model), version)
            t0 = time.perf_counter()
            sync.flush()
            flush.append(time.perf_counter() - t0)
            f0, t0 = minor_faults(pid), time.perf_counter()
            pool.greedy([prompt] * prompts, tokens)
            gen.append(prompts * tokens / (time.perf_counter() - t0))
            faults.append((minor_faults(pid) - f0) / (prompts * tokens))
        adapter_mb = sum(t.numel() * 4 for _, t in lora_tensors(model)) / 2**20
        params = sum(p.numel() for p in base.parameters())
        return {
            "mode": mode,
            "params": params,
            "adapter_mb": round(adapter_mb, 2),
            "flush_s": [round(x, 3) for x in flush],
            "greedy_tok_s_before_updates": round(before, 1),
            "greedy_tok_s": [round(x, 1) for x in gen],
            "minor_faults_per_token": [round(x, 1) for x in faults],  # before the updates, then after each
            "allocator_env": allocator_env(one_arena=True),
            "engine_memory_started": started,
            "engine_memory_after_updates": peak_rss_gib(pid),
        }
    finally:
        pool.shutdown()
        ray.shutdown()


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model folder, or qwen05b (default: the built-in model)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the engine's model.dtype")
    parser.add_argument("--modes", nargs="+", default=["merge", "native"], choices=["merge", "native"])
    parser.add_argument("--out", default="", help="JSON result (default: print only)")
    args = parser.parse_args(argv)
    import ray

    from agentrl_ray.builtin.model import ensure_builtin_model

    if args.model == "qwen05b":
        from suite.learner.qwen05b_shape import ensure_qwen05b_shape

        args.model = str(ensure_qwen05b_shape())
    model_path = args.model or str(ensure_builtin_model())
    results = []
    for mode in args.modes:
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        results.append(measure(mode, model_path, args.rank, args.versions, args.prompts, args.tokens, args.dtype))
        print(json.dumps(results[-1]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        summary = "; ".join(
            f"{r['mode']}: flush {max(r['flush_s']):.3f} s at most, greedy {r['greedy_tok_s_before_updates']} tok/s "
            f"before updates, {min(r['greedy_tok_s'])} after"
            for r in results
        )
        result = {"model": model_path, "results": results}
        Path(args.out).write_text(json.dumps(with_meta(result, summary), indent=2))
