"""How far a training step is from what this machine's CPU could do: a roofline for generation and the learner.

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py roofline                                  # built-in model, runs/calculator/metrics.jsonl
    python benchmarks/run.py roofline --run-dir runs/bench/throughput  # another run's measured step
    python benchmarks/run.py roofline --model DIR --samples 128 --tokens 4500 --generate-s 0.5 --learner-s 0.7

1. Measures, with torch on CPU using the threads each phase ran with: GEMM throughput in float32 and bfloat16
   for a large square GEMM and for decode-shaped GEMMs (64 rows, i.e. 64 sequences decoding together, times the
   model's hidden -> intermediate projection, and the same at hidden 2048 for scale), and memory bandwidth from a
   large tensor copy.
2. From the model's config, the lower bound of each phase of one training step:
   - generation (decode): 2 * params FLOPs per token (+ attention over the context), and per decode iteration the
     weights read once plus every sequence's KV cache; the iteration count is at least the mean sampled tokens per
     trajectory (all sequences decode in lock step), the best case for the bytes bound;
   - learner: 6 * params FLOPs per trained token (forward + backward, + attention), with AdamW's reads and writes;
     under LoRA 4 * the frozen body's params (forward, and the backward through the activations: no weight
     gradient) + 6 * the adapters' params. The head (vocabulary x hidden) only over the scored tokens, whose
     log-probs the loss reads, and a group's shared prompt once (the least an exact learner computes).
   A phase's bound is the larger of its FLOP time (at the large-GEMM rate of its dtype and thread count) and its byte
   time (at the copy bandwidth). The whole step's bound is the phases' sum on-policy, the slower one overlapped.
3. Prints each phase's measured time (the run's mean over steps 2..N), its bound and the fraction bound/measured;
   with --vs-step-s (another trainer's step at the same work), the most this step could beat it by, and the
   fraction of the bound that --times x would need.

    # the side-by-side's shape (docs/benchmarks.md, "Current results"): its measured phases on the command line
    python benchmarks/run.py roofline --model qwen05b --lora-r 16 --group 8 \
        --samples 64 --tokens 16384 --prompt-len 58.75 --generate-s 69.4 --learner-s 140.0 --step-s 209.4 \
        --gen-dtype bf16 --learner-dtype bf16 --gen-threads 2 --learner-threads 2 --vs-step-s 595.0

Read the fractions with the model size in mind: the built-in model has 0.44M parameters (1.8 MB in float32, which
sits in the CPU's cache), so a step is dominated by per-call overhead (Python, kernel launches, vLLM scheduling,
tokenization, Ray), not by FLOPs or bytes; the output says how far.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from results_path import ROOT, default_out, with_meta


def best_time(fn, *, min_s: float = 0.5, warmup: int = 2) -> float:
    """Fastest of repeated calls (seconds per call), running for at least `min_s`: the machine is shared."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_s or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def gemm_flops(m: int, k: int, n: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / best_time(lambda: torch.mm(a, b))


def copy_bandwidth(mib: int = 512) -> float:
    """Bytes per second moved by a large copy (each byte read once and written once)."""
    src = torch.empty(mib * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_time(lambda: dst.copy_(src), min_s=1.0)


def measure_machine(hidden: int, intermediate: int) -> dict[str, float]:
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        out[f"gemm_2048_{name}_gflops"] = gemm_flops(2048, 2048, 2048, dtype) / 1e9
        out[f"gemm_decode_64x{hidden}x{intermediate}_{name}_gflops"] = gemm_flops(64, hidden, intermediate, dtype) / 1e9
        out[f"gemm_decode_64x2048x2048_{name}_gflops"] = gemm_flops(64, 2048, 2048, dtype) / 1e9
    out["copy_gb_per_s"] = copy_bandwidth() / 1e9
    return out


# ---------------------------------------------------------------------------------------------------- the model


def body_params(model: torch.nn.Module) -> int:
    """What multiplies every token: the decoder's weight matrices (no embedding lookup, no head, and no norm or
    bias, which add rather than multiply)."""
    skip = {id(model.get_output_embeddings().weight), id(model.get_input_embeddings().weight)}
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2 and id(p) not in skip)


def shape_of(model: torch.nn.Module) -> dict[str, float]:
    """The sizes the bounds price, from a causal LM (its weights may live on the meta device)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "params": sum(p.numel() for p in model.parameters()),  # tied embeddings counted once (the lm_head matmul)
        "head_params": model.get_output_embeddings().weight.numel(),
        "body_params": body_params(model),
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "attn_dim": config.num_attention_heads * head_dim,  # query width: QK^T and AV cost per context position
        "kv_dim": config.num_key_value_heads * head_dim,
        "vocab": config.vocab_size,
    }


def model_shape(path: str) -> dict[str, float]:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return shape_of(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)))


def measured_step(run_dir: Path) -> dict[str, float]:
    """Mean of steps 2..N of a run: phase times and token counts (prompt lengths from the built-in task's template)."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "time/step_s" in r][1:]
    if not steps:
        raise SystemExit(f"{run_dir}/metrics.jsonl has fewer than 2 training steps")
    cfg = json.loads((run_dir / "config.json").read_text())
    samples = cfg["rollout"]["prompts_per_step"] * cfg["rollout"]["group_size"]
    mean = lambda k: statistics.mean(r[k] for r in steps)  # noqa: E731
    return {
        "steps": len(steps),
        "samples": samples,
        "sampled_tokens": mean("rollout/sampled_tokens"),
        "completion_tokens": samples * mean("rollout/mean_length"),  # sampled + tool-result tokens
        "step_s": mean("time/step_s"),  # the trainer's own step time
        "generate_s": mean("time/generate_s"),
        "learner_s": mean("time/learner_s"),
    }


# The seven projections LoRA adapts by default (learner.lora.target_modules): (input width, output width).
PROJECTIONS = {
    "q_proj": ("hidden", "attn_dim"),
    "k_proj": ("hidden", "kv_dim"),
    "v_proj": ("hidden", "kv_dim"),
    "o_proj": ("attn_dim", "hidden"),
    "gate_proj": ("hidden", "intermediate"),
    "up_proj": ("hidden", "intermediate"),
    "down_proj": ("intermediate", "hidden"),
}


def lora_params(m: dict, r: int, targets=tuple(PROJECTIONS)) -> int:
    """Parameters of rank-`r` adapters (A: r x in, B: out x r) on `targets` in every decoder layer."""
    return m["layers"] * sum(r * (m[PROJECTIONS[t][0]] + m[PROJECTIONS[t][1]]) for t in targets)


def learner_flops(
    m: dict, tokens: float, scored: float, *, lora_r: int = 0, targets=tuple(PROJECTIONS), context: float = 0.0
) -> dict[str, float]:
    """FLOPs of one forward + backward over `tokens` positions, `scored` of them through the head, by part.

    Full fine-tune: 6 x params (2 forward, 2 for the activations' gradient, 2 for the weights'). LoRA of rank
    `lora_r` on `targets`: the frozen body 4 x (no weight gradient), the adapters 6 x; in the first layer, whose
    input (the embedding) needs no gradient, q, k and v (base and adapter A) skip the input's gradient.
    `context`: mean positions each token attends to (QK^T and AV, 3 x forward)."""
    if not lora_r:
        return {
            "body": tokens * 6 * m["body_params"],
            "head": scored * 6 * m["head_params"],
            "adapters": 0.0,
            "attention": tokens * 3 * 4 * m["layers"] * m["attn_dim"] * context,
        }
    first = ("q_proj", "k_proj", "v_proj")
    first_base = sum(m["hidden"] * m[PROJECTIONS[t][1]] for t in first)
    first_a = sum(lora_r * m["hidden"] for t in first if t in targets)
    return {
        "body": tokens * (4 * m["body_params"] - 2 * first_base),
        "head": scored * 4 * m["head_params"],
        "adapters": tokens * (6 * lora_params(m, lora_r, targets) - 2 * first_a),
        "attention": tokens * 3 * 4 * m["layers"] * m["attn_dim"] * context,
    }


def bounds(
    m: dict[str, float],
    step: dict[str, float],
    hw: dict[str, dict],
    prompt_len: float,
    *,
    group: int = 1,
    lora_r: int = 0,
    targets=tuple(PROJECTIONS),
) -> dict[str, dict]:
    """Lower-bound seconds of generation and of the learner update for one step, each at the GEMM rate of the
    threads and dtype it ran with (`hw["generation"]`, `hw["learner"]`: {"gflops", "gb_per_s", "bytes_per_param"}).
    `group`: copies of each prompt (their prompt computed once); `lora_r`: LoRA's rank on `targets` (0: a full
    fine-tune)."""
    n, p = step["samples"], m["params"]
    per_traj = step["completion_tokens"] / n
    seq = prompt_len + per_traj  # tokens per trajectory
    prompts = n / group * prompt_len  # distinct prompt tokens: a group's copies share theirs
    # Generation: prefill the prompts and the tool results (prefix caching spares the rest of a multi-turn history),
    # decode the sampled tokens, each through the head; causal attention reads on average half the context.
    attn_fwd = 4 * m["layers"] * m["attn_dim"] * (seq / 2)  # FLOPs per token for QK^T and AV
    gen_flops = (prompts + step["completion_tokens"]) * (2 * m["body_params"] + attn_fwd)
    gen_flops += step["sampled_tokens"] * 2 * m["head_params"]
    iterations = step["sampled_tokens"] / n  # lock-step decode: at least the mean sampled length
    b = hw["generation"]["bytes_per_param"]
    kv_bytes = n * iterations * (seq / 2) * m["layers"] * 2 * m["kv_dim"] * b
    gen_bytes = iterations * p * b + kv_bytes
    # Learner: forward + backward over every real token (a group's prompt once), the head over the completions;
    # AdamW reads weights, grads, 2 moments and writes 3 of them (float32 master weights whatever the matmul dtype).
    train_tokens = prompts + step["completion_tokens"]
    parts = learner_flops(m, train_tokens, step["completion_tokens"], lora_r=lora_r, targets=targets, context=seq / 2)
    learn_flops = sum(parts.values())
    trained = lora_params(m, lora_r, targets) if lora_r else p
    learn_bytes = 7 * trained * 4 + train_tokens * m["layers"] * m["hidden"] * hw["learner"]["bytes_per_param"] * 10
    out = {}
    for name, flops, nbytes, measured in (
        ("generation", gen_flops, gen_bytes, step["generate_s"]),
        ("learner", learn_flops, learn_bytes, step["learner_s"]),
    ):
        rate = hw[name]
        flop_s, byte_s = flops / (rate["gflops"] * 1e9), nbytes / (rate["gb_per_s"] * 1e9)
        out[name] = {
            "gflop": flops / 1e9,
            "gbyte": nbytes / 1e9,
            "flop_bound_s": flop_s,
            "byte_bound_s": byte_s,
            "bound_s": max(flop_s, byte_s),
            "measured_s": measured,
            "fraction_of_roofline": max(flop_s, byte_s) / measured,
            **{k: rate[k] for k in ("threads", "dtype", "gflops")},
        }
    # The step: the phases one after the other on-policy; overlapped, the slower one (they run on separate cores).
    g, le = out["generation"]["bound_s"], out["learner"]["bound_s"]
    whole = max(g, le) if step.get("overlapped") else g + le
    out["whole step"] = {
        "gflop": (gen_flops + learn_flops) / 1e9,
        "gbyte": (gen_bytes + learn_bytes) / 1e9,
        "flop_bound_s": whole,
        "byte_bound_s": 0.0,
        "bound_s": whole,
        "measured_s": step["step_s"],
        "fraction_of_roofline": whole / step["step_s"],
    }
    out["learner"]["gflop_by_part"] = {k: v / 1e9 for k, v in parts.items()}
    # Per decode iteration: what the engine spends beyond the arithmetic is per-iteration overhead.
    out["generation"]["decode_iterations_at_least"] = iterations
    out["generation"]["measured_s_per_iteration_at_most"] = step["generate_s"] / iterations
    out["generation"]["flop_bound_s_per_iteration"] = out["generation"]["flop_bound_s"] / iterations
    return out


def phase_settings(run_dir: Path | None, args) -> dict[str, tuple[int, str]]:
    """(threads, dtype) each phase ran with: from the run's config.json (its thread defaults resolved for this
    machine), else the command line."""
    from agentrl_ray.infra.threads import default_threads

    cfg = json.loads((run_dir / "config.json").read_text()) if run_dir and (run_dir / "config.json").exists() else {}
    overlapped = cfg.get("sync", {}).get("max_staleness", 0) > 0
    workers = cfg.get("rollout", {}).get("num_workers", 1)
    learners = cfg.get("learner", {}).get("num_workers", 1)
    gen_threads = (
        args.gen_threads
        or cfg.get("rollout", {}).get("num_threads")
        or default_threads("rollout", overlapped=overlapped, rollout_workers=workers)
    )
    learn_threads = (
        args.learner_threads
        or cfg.get("learner", {}).get("torch_threads")
        or default_threads("learner", overlapped=overlapped, rollout_workers=workers, learner_workers=learners)
    )
    gen_dtype = args.gen_dtype or ("bf16" if cfg.get("model", {}).get("dtype") == "bfloat16" else "fp32")
    learn_dtype = args.learner_dtype or ("bf16" if cfg.get("learner", {}).get("bf16") else "fp32")
    return {"generation": (gen_threads, gen_dtype), "learner": (learn_threads, learn_dtype), "overlapped": overlapped}


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="HF model folder, or qwen05b (learner --mode qwen05b_shape; default: built-in)")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "calculator")
    p.add_argument("--prompt-len", type=float, default=58.8, help="mean prompt tokens (built-in task: 58.8)")
    for name in ("samples", "tokens", "completion-tokens", "generate-s", "learner-s", "step-s"):
        p.add_argument(f"--{name}", type=float, help="use instead of the run's metrics (give them all)")
    p.add_argument("--gen-threads", type=int, help="threads generation ran with (default: from the run's config)")
    p.add_argument("--learner-threads", type=int, help="threads the learner ran with (default: the run's config)")
    p.add_argument("--gen-dtype", choices=["fp32", "bf16"], help="default: the run's model.dtype")
    p.add_argument("--learner-dtype", choices=["fp32", "bf16"], help="default: bf16 if the run's learner.bf16")
    p.add_argument("--group", type=int, help="copies of each prompt (default: the run's rollout.group_size, else 1)")
    p.add_argument("--lora-r", type=int, help="LoRA rank on the seven projections (default: the run's, else none)")
    p.add_argument("--vs-step-s", type=float, help="another trainer's step at the same work: how far --times x is")
    p.add_argument("--times", type=float, default=4.0, help="the speed-up over --vs-step-s to price (default 4)")
    p.add_argument("--out", type=Path, help="JSON result (default: benchmarks/results/roofline/<date>-<machine>.json)")
    args = p.parse_args(argv)
    if args.model is None:
        from agentrl_ray.builtin.model import ensure_builtin_model

        args.model = str(ensure_builtin_model())
    elif args.model == "qwen05b":
        from suite.learner.qwen05b_shape import ensure_qwen05b_shape

        args.model = str(ensure_qwen05b_shape())
    m = model_shape(args.model)
    if args.tokens is not None:
        step = {
            "samples": args.samples,
            "sampled_tokens": args.tokens,
            "completion_tokens": args.completion_tokens or args.tokens,
            "generate_s": args.generate_s,
            "learner_s": args.learner_s,
            "step_s": args.step_s or args.generate_s + args.learner_s,
            "source": "command line",
        }
        settings = phase_settings(None, args)
    else:
        step = {**measured_step(args.run_dir), "source": str(args.run_dir)}
        settings = phase_settings(args.run_dir, args)
    step["overlapped"] = settings.pop("overlapped")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores; phases ran with {settings}")
    machine: dict[int, dict[str, float]] = {}
    for threads in sorted({t for t, _ in settings.values()}):
        torch.set_num_threads(threads)
        machine[threads] = measure_machine(m["hidden"], m["intermediate"])
        for k, v in machine[threads].items():
            print(f"  {threads} thread(s) {k:<40} {v:10.1f}")
    hw = {
        phase: {
            "threads": t,
            "dtype": d,
            "gflops": machine[t][f"gemm_2048_{d}_gflops"],
            "gb_per_s": machine[t]["copy_gb_per_s"],
            "bytes_per_param": 2 if d == "bf16" else 4,
        }
        for phase, (t, d) in settings.items()
    }
    print(f"model: {m['params'] / 1e6:.2f}M params ({m['params'] * 4 / 2**20:.1f} MiB fp32), {m}")
    print(f"step ({step['source']}): {json.dumps({k: round(v, 2) for k, v in step.items() if k != 'source'})}")
    config = args.run_dir / "config.json" if args.tokens is None else None
    cfg = json.loads(config.read_text()) if config and config.exists() else {}
    group = args.group or cfg.get("rollout", {}).get("group_size", 1)
    lora_cfg = cfg.get("learner", {}).get("lora", {})
    rank = args.lora_r if args.lora_r is not None else (lora_cfg.get("r", 0) if lora_cfg.get("enabled") else 0)
    targets = lora_cfg.get("target_modules") or tuple(PROJECTIONS)
    lora = f"r {rank}, {lora_params(m, rank, targets) / 1e6:.2f}M params" if rank else "none"
    print(f"a group's {group} copies share their prompt; LoRA: {lora}")
    result = bounds(m, step, hw, args.prompt_len, group=group, lora_r=rank, targets=targets)
    print(f"{'phase':<12}{'GFLOP':>9}{'GB':>9}{'FLOP bound':>12}{'byte bound':>12}{'measured':>10}{'fraction':>10}")
    for name, r in result.items():
        print(
            f"{name:<12}{r['gflop']:9.2f}{r['gbyte']:9.3f}{r['flop_bound_s']:11.4f}s{r['byte_bound_s']:11.4f}s"
            f"{r['measured_s']:9.3f}s{100 * r['fraction_of_roofline']:9.2f}%"
        )
    g = result["generation"]
    print(
        f"generation: >= {g['decode_iterations_at_least']:.0f} decode iterations per step, so <= "
        f"{1e3 * g['measured_s_per_iteration_at_most']:.1f} ms measured per iteration against a FLOP bound of "
        f"{1e3 * g['flop_bound_s_per_iteration']:.2f} ms"
    )
    print(f"learner GFLOP by part: {json.dumps({k: round(v) for k, v in result['learner']['gflop_by_part'].items()})}")
    whole = result["whole step"]["bound_s"]
    vs = None
    if args.vs_step_s:
        # At the bound this step is vs / bound times faster than the other; --times x needs a step of vs / x.
        vs = {
            "other_step_s": args.vs_step_s,
            "most_times_faster": args.vs_step_s / whole,
            "times": args.times,
            "fraction_of_bound_needed": whole / (args.vs_step_s / args.times),
            "measured_times_faster": args.vs_step_s / step["step_s"],
        }
        print(
            f"against a step of {args.vs_step_s:.1f} s: at its bound ({whole:.1f} s) this step is at most "
            f"{vs['most_times_faster']:.2f}x faster (measured {vs['measured_times_faster']:.2f}x); {args.times:g}x "
            f"needs a step of {args.vs_step_s / args.times:.1f} s, {100 * vs['fraction_of_bound_needed']:.0f}% of the "
            f"bound over the whole step"
        )
    report = {"machine": machine, "model": m, "step": step, "group": group, "lora_r": rank, "bounds": result, "vs": vs}
    args.out = args.out or default_out("roofline")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    measured = step["step_s"]
    summary = f"whole-step bound {whole:.1f} s, {100 * whole / measured:.0f}% of the measured {measured:.1f} s"
    if vs:
        summary += f"; at most {vs['most_times_faster']:.2f}x faster than a {args.vs_step_s:.1f} s step"
    args.out.write_text(json.dumps(with_meta(report, summary), indent=2))
    print(f"wrote {args.out}")
