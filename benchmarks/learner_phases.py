"""The learner's phases (forward, backward, optimizer) at the 0.5B-class LoRA shape, timed apart, per variant.

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/learner_phases.py --samples 2 --seq 316 --out benchmarks/results/learner_phases_05b.json

One micro-batch of `samples` sequences of `seq` tokens (60 prompt + 256 completion) through the model of
benchmarks/qwen05b_shape.py with PEFT LoRA (r 16, alpha 32, our `learner.lora.target_modules`), bfloat16 autocast,
AdamW over the adapter: the work of our learner per micro-batch, without Ray (the same `Policy` math: the chunked
path is `Policy.token_logprobs`'s, the full path the model's own logits). Variants, each in its own subprocess so
that its peak RSS is its own:
- `fp32base_full`: float32 base weights + autocast, full (B, T, V) logits (the learner before this round);
- `fp32base_chunked`: the same with `learner.chunked_logprobs` (the current default);
- `bf16base_chunked`: the frozen base loaded in bfloat16 (adapter float32): no float32 copy, no per-call casts;
- `nf4base_chunked`: QLoRA (`learner.lora.quantize=nf4`): the blocks' Linear weights in 4-bit NF4 (bitsandbytes,
  loaded by the learner's own `qlora.load_quantized`), the embedding/head in bfloat16;
- `fp32_chunked`: float32 throughout, no autocast (our learner without `learner.bf16`: the choice on a CPU without
  native bfloat16, where bfloat16 GEMMs are emulated);
- `fp32_chunked_scored`: the same, the head computed only where a loss reads it (the completion, after the first
  `--prompt-len` tokens: `needed` of chunked_logprobs, as the learner passes it).
- `*_compiled`: the same with every decoder layer compiled as `learner.compile` does (`policy.compile_layers`:
  `torch.compile`, inductor, dynamic shapes); the first step, which compiles, is reported as `compile_step_s`.
Times are the best of `--repeats` steps after one warm-up step; per token = / (samples * seq).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
VARIANTS = (
    "fp32base_full",
    "fp32base_chunked",
    "bf16base_chunked",
    "nf4base_chunked",
    "fp32_chunked",
    "fp32_chunked_scored",
    "fp32_chunked_scored_compiled",
    "bf16base_chunked_scored",
    "bf16base_chunked_scored_compiled",
)


def current_rss_gib() -> float:
    """This process's resident set now (VmRSS), in GiB."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 2**20


def one(variant: str, samples: int, seq: int, threads: int, repeats: int, prompt_len: int, profile: int = 0) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from qwen05b_shape import ensure_qwen05b_shape
    from transformers import AutoModelForCausalLM

    from agentrl_ray.config import LoraConfig as OurLora
    from agentrl_ray.learner.chunked_logprobs import hidden_token_logprobs
    from agentrl_ray.learner.compilation import compile_layers
    from agentrl_ray.learner.logprobs import token_logprobs_and_entropy
    from agentrl_ray.learner.policy import hidden_states_out, model_head

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base_dtype = torch.bfloat16 if variant.startswith("bf16") else torch.float32
    t0 = time.perf_counter()
    if variant.startswith("nf4"):
        from agentrl_ray.config import LearnerConfig
        from agentrl_ray.learner.qlora import load_quantized

        model = load_quantized(ensure_qwen05b_shape(), LearnerConfig(bf16=True), torch.device("cpu"))
    else:
        model = AutoModelForCausalLM.from_pretrained(ensure_qwen05b_shape(), dtype=base_dtype)
    ours = OurLora()
    model = get_peft_model(
        model, LoraConfig(r=ours.r, lora_alpha=ours.alpha, lora_dropout=0.0, target_modules=ours.target_modules)
    )
    model.config.use_cache = False
    if variant.endswith("compiled"):
        compile_layers(model, torch.device("cpu"))  # what learner.compile does
    load_s = time.perf_counter() - t0
    gc.collect()
    rss_after_load = current_rss_gib()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, 370, (samples, seq))
    mask = torch.ones_like(ids)
    head = model_head(model)
    needed = None
    if "scored" in variant:
        needed = torch.zeros(ids.shape, dtype=torch.bool)
        needed[:, prompt_len:] = True

    def step() -> dict[str, float]:
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not variant.startswith("fp32_")):
            if "chunked" in variant:
                with hidden_states_out(head):
                    hidden = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                logp, _ = hidden_token_logprobs(hidden, head.weight, ids, needed=needed)
            else:
                logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                logp, _ = token_logprobs_and_entropy(logits, ids)
        loss = -logp.mean()
        t_fwd = time.perf_counter()
        loss.backward()
        t_bwd = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_opt = time.perf_counter()
        return {"forward_s": t_fwd - t, "backward_s": t_bwd - t_fwd, "optimizer_s": t_opt - t_bwd}

    t_first = time.perf_counter()
    step()  # warm-up (and compilation)
    compile_step_s = time.perf_counter() - t_first
    runs = [step() for _ in range(repeats)]
    ops = profile_step(step, profile) if profile else None
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    tokens = samples * seq
    return {
        "variant": variant,
        "load_average_1min": __import__("os").getloadavg()[0],  # other work on the shared machine
        "samples": samples,
        "seq": seq,
        "tokens": tokens,
        "threads": threads,
        "load_s": load_s,
        "compile_step_s": compile_step_s,
        **best,
        "step_s": sum(best.values()),
        "tokens_per_s": tokens / sum(best.values()),
        "runs": runs,
        "trainable_params": sum(p.numel() for p in params),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # loading's transients included
        "rss_after_steps_gib": current_rss_gib(),  # what stays resident while training
        "resident_after_load_gib": rss_after_load,
        **({"profile_top_ops": ops} if ops else {}),
    }


def profile_step(step, top: int) -> list[dict]:
    """One more step under torch.profiler: the `top` operators by self CPU time (where a step's time goes that
    is not GEMM: the non-GEMM share is what separates the learner from its roofline bound)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    return [
        {"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total, "calls": e.count}
        for e in rows[:top]
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--seq", type=int, default=316)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=60, help="tokens of each sequence no loss reads (`scored`)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--profile", type=int, default=0, help="profile one more step: report the top N operators")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.samples, a.seq, a.threads, a.repeats, a.prompt_len, a.profile)))
        return
    rows = []
    for v in a.variants.split(","):
        cmd = [sys.executable, __file__, "--one", v, f"--samples={a.samples}", f"--seq={a.seq}"]
        cmd += [f"--threads={a.threads}", f"--repeats={a.repeats}", f"--prompt-len={a.prompt_len}"]
        cmd += [f"--profile={a.profile}"]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            print(f"{v}: failed: {res.stderr[-600:]}")
            rows.append({"variant": v, "error": res.stderr[-600:]})
            continue
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{v:<18} fwd {r['forward_s']:.2f}s bwd {r['backward_s']:.2f}s opt {r['optimizer_s']:.3f}s "
            f"= {r['tokens_per_s']:.0f} tok/s, peak RSS {r['peak_rss_gib']:.2f} GiB, resident after load "
            f"{r['resident_after_load_gib']:.2f} and after the steps {r['rss_after_steps_gib']:.2f} GiB "
            f"(load {r['load_s']:.1f}s, first step {r['compile_step_s']:.1f}s)",
            flush=True,
        )
        for op in r.get("profile_top_ops", []):
            print(f"    {op['op']:<40} {op['self_s']:7.2f}s {op['share']:6.1%} x{op['calls']}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
