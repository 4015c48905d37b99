"""The learner's training throughput and MFU through its own code (`Policy` + `update`: GRPO + ECHO on chunked
log-probs), on CUDA at the real shapes and on a CPU at a small one, with each speed lever on and off.

    python benchmarks/run.py learner --device cuda --shape 0.5b --out /tmp/lt.json     # one GPU
    python benchmarks/run.py learner --device cuda --shape 1.5b --variants full,lora
    python benchmarks/run.py learner --device cpu --shape tiny --steps 1 --warmup 1   # the logic, on a CPU
    python benchmarks/run.py learner --device cpu --shape 0.5b --micro-batch 4 --micro-batches 4 \
        --seq 316 --min-len 314 --prompt-len 58 --warmup 1 --steps 3 --peak-tflops 0.964 \
        --variants lorabf16.old,lorabf16,lorabf16.compile   # the 0.5B side-by-side's learner, 16 of its 64 sequences

Ray is not started: each variant runs in its own process as one Ray Train worker would (`ray.train.get_context` and
`ray.train.torch.get_device` answer for a 1-rank group; torch.distributed is initialised with world size 1, NCCL on
CUDA, gloo on a CPU). tests/gpu/test_gpu_learner.py covers the real Ray Train path.

A variant is a setting and its levers, `SETTING[.LEVER...]`:
- settings: `full` (the GPU profile: DeepSpeed ZeRO-2, bfloat16 weights with float32 masters; on a CPU: DDP,
  float32) and `lora` (profile=lora: r 16, alpha 32, every linear kind, bfloat16 base under autocast; on a CPU
  float32), and on a CPU `lorabf16` (the 0.5B side-by-side's learner: bfloat16 base under autocast);
- `old`: the learner before the levers of docs/learner_speed.md and of docs/benchmarks.md ("The CPU learner's
  levers"): 64 MiB head chunks (110 tokens at 152k vocabulary), the attention mask always passed,
  torch's default (multi-tensor) AdamW, PEFT casting each adapter's input to float32, the NaN/inf guard checking
  each gradient tensor with a host sync of its own, the head's backward recomputing its logits (instead of reading the
  probabilities forward kept), each micro-batch's shared prompt computed per row (`learner.shared_prefix` off);
  `-chunk`, `-nomask`, `-fusedadam`, `-peftcast`, `-gradcheck`, `-keep`, `-share` turn one of them back alone;
- `compile`: learner.compile=true (every decoder layer compiled, and the head's chunk math fused);
- `mb16`: one micro-batch of 16 sequences instead of two of 8;
- `zero0`, `zero1`: DeepSpeed's ZeRO stage 0 or 1 instead of 2 (one GPU has nothing to partition);
- `share`: learner.shared_prefix=true (its `auto` leaves it off on a GPU; `--paired-share` needs it on);
- `flash`: a packed micro-batch's remainders attend through SDPA's CPU flash kernel, as before round 12, instead of
  `learner/levers/cpu_attention.py`'s GEMMs (CPU only);
- with `compile`: `static` compiles the layers for this benchmark's fixed shape (`dynamic=False`; a run's batches
  change length every step, so the learner compiles them with dynamic shapes), `cudagraphs` on top of that replays
  them as CUDA graphs (`mode="reduce-overhead"`; with layers compiled one by one this fails on a GPU: the 24
  layers share one graph, whose replay overwrites the previous layer's output), `stack` compiles the module holding
  the layers as one graph instead of each layer (one call's host overhead per forward, and one CUDA graph), `fuse`
  runs a layer's linears that read the same input as one matmul (learner/levers/linear_fusion.py; off by default),
  `bucket` sets learner.compile_buckets=128 (each forward right-padded to a multiple of 128 tokens, a fixed-shape
  graph per length: what `static` measures, for a run's changing lengths; give it `--ragged` or `--min-len`).

A step is `--micro-batches` x `--micro-batch` sequences of up to `--seq` tokens (default 2 x 8 x 1,024): a
`--prompt-len` prompt (no loss), then 3/16-of-seq action segments and 1/16-of-seq tool-result segments alternating
to the end; `--ragged` draws each sequence's length uniformly in [seq/2, seq] (right-padded, as real batches are),
`--min-len L` in [L, seq] (the 0.5B side-by-side's batches: prompts of 57-59 tokens + 256 sampled, `--min-len 314
--seq 316`).
FLOPs per step, T = real tokens, S = scored tokens (action + env targets), N_body = decoder parameters and final
norm, N_head = vocab x hidden: full fine-tune 6*N_body*T + 6*N_head*S; LoRA 4*N_body*T + 4*N_head*S + 6*N_lora*T
(frozen weights have no weight gradient). Attention's T^2 matmuls and the head's recomputation in backward are not
counted. MFU = FLOPs / median step / `--peak-tflops` (790: an H200's measured dense bfloat16 rate, the number the
earlier measurements used); `matmul_tflops` is this device's own bfloat16 8192^3 matmul rate, measured first.
`peak_mem_gib` is CUDA's peak allocation; `peak_rss_gib` the variant process's peak resident memory (on a CPU,
what the learner holds: model, activations, allocator caches).
`--paired N` then runs N steps with the exact eager levers (`-nomask`, `-peftcast`) off and N on, alternating in the
same process (`paired_off_s`, `paired_on_s`): at a few percent they are below the spread between processes.
`--paired-keep N` does the same for the head's kept probabilities (`paired_keep_off_s`, `paired_keep_on_s`);
`--paired-scatter N` for how their gradient writes the targets (`paired_scatter_s`, `paired_index_put_s`);
`--paired-share N` for `learner.shared_prefix` (`paired_share_off_s`, `paired_share_on_s`). A group's 8 sequences
share their `--prompt-len` prompt.
Each variant also records its log-probs of the first micro-batch before any update; `logprob_gap_vs` is the largest
difference at scored positions against the setting's first variant (the levers must not change the numbers beyond
bfloat16 kernel rounding).
Each variant runs in its own process; `--variant-timeout S` stops one after S seconds and goes on to the next,
recording what it printed so far (a line per step: how far its compilation got), so that on a lent GPU one slow
compilation does not take the variants after it (GPU round 4: a 270 s cut took the baseline with it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_path import ROOT, with_meta

sys.path.insert(0, str(ROOT))

SETTINGS = {
    "cuda": {
        "full": ["profile=gpu", "learner.num_workers=1"],
        "lora": ["profile=lora", "learner.use_gpu=true", "learner.bf16=true", "learner.lora.r=16"],
    },
    "cpu": {
        "full": ["profile=cpu", "learner.backend=ddp"],
        "lora": ["profile=lora", "learner.bf16=false", "learner.lora.r=16"],
        # the 0.5B side-by-side's learner on a CPU with native bfloat16: bfloat16 base, autocast, r 16
        "lorabf16": ["profile=lora", "learner.bf16=true", "model.dtype=bfloat16", "learner.lora.r=16"],
    },
}
CHILD_ARGS = ("device", "shape", "micro_batch", "micro_batches", "seq", "prompt_len", "warmup", "steps", "profile")
CHILD_ARGS += ("peak_tflops", "min_len", "paired", "paired_keep", "paired_thread", "paired_scatter", "paired_share")
LEVERS = ("old", "-chunk", "-nomask", "-fusedadam", "-peftcast", "-gradcheck", "-keep", "-share", "compile", "mb16")
LEVERS += ("zero0", "zero1", "static", "cudagraphs", "stack", "share", "fuse", "bucket", "flash")
BUCKET = 128  # the `bucket` lever's learner.compile_buckets
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
}  # fmt: skip


def shape_config(shape: str) -> dict:
    from suite.learner.qwen05b_shape import QWEN25_05B  # the project's definition of the 0.5B shape

    config = dict(QWEN25_05B)
    config.update(SHAPES.get(shape, {}))
    return config


def build_model(folder: Path, shape: str, device: str) -> None:
    """Random bfloat16 weights of the shape, initialised on the device, saved as a Hugging Face folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**shape_config(shape))).to(torch.bfloat16)
    model.save_pretrained(folder)


def batch_groups(args, vocab: int):
    """`micro_batches * micro_batch` trajectories in groups of 8, rewards alternating (non-zero advantages)."""
    import torch

    from agentrl_ray.types import Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(0)
    action, env = max(4, args.seq * 3 // 16), max(2, args.seq // 16)
    groups, n = [], args.micro_batches * args.micro_batch
    for p in range(0, n, 8):
        trajs = []
        prompt = torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist()  # a group's rows share it
        for s in range(min(8, n - p)):
            shortest = args.seq // 2 if args.ragged else (args.min_len or args.seq)
            length = int(torch.randint(shortest, args.seq + 1, (1,), generator=g)) if shortest < args.seq else args.seq
            roles = [0] * args.prompt_len
            while len(roles) < length:
                roles += [1] * action + [2] * env
            roles = roles[:length]
            trajs.append(
                Trajectory(
                    prompt_id=f"p{p}",
                    sample_index=s,
                    token_ids=(prompt + torch.randint(3, vocab, (length,), generator=g).tolist())[:length],
                    action_mask=[int(r == 1) for r in roles],
                    env_mask=[int(r == 2) for r in roles],
                    template_mask=[0] * length,
                    rollout_logprobs=[-8.0 * (r == 1) for r in roles],
                    reward=float(s % 2),
                    policy_version=0,
                    finish_reason="answer",
                    prompt_len=args.prompt_len,
                )
            )
        groups.append(TrajectoryGroup(prompt_id=f"p{p}", trajectories=trajs))
    return groups


def stand_in_for_ray_train(device) -> None:
    """What a 1-worker TorchTrainer gives its worker: a rank-0-of-1 context, its device, a process group."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    class Context:
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 1

    ray.train.get_context = Context
    ray.train.torch.get_device = lambda: device
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def apply_levers(levers: list[str]) -> None:
    """`old` and the `-X` levers put the learner's code back as it was before each lever (module attributes)."""
    from agentrl_ray.learner import guards, policy
    from agentrl_ray.learner.levers import chunked_logprobs

    old = {"-chunk", "-nomask", "-fusedadam", "-peftcast", "-gradcheck", "-keep"}
    off = set(levers) if "old" not in levers else old
    if "-chunk" in off:
        chunked_logprobs.CUDA_CHUNK_ELEMENTS = chunked_logprobs.CHUNK_ELEMENTS
    if "-nomask" in off:
        policy.right_padded = lambda mask: False
    if "-fusedadam" in off:
        policy.FUSED_ADAMW = False
    if "-peftcast" in off:
        policy.LORA_INPUT_UNCAST = False
    if "-gradcheck" in off:
        guards.ONE_NORM_CHECK = False
    if "-keep" in off:
        chunked_logprobs.KEEP_BYTES = chunked_logprobs.CUDA_KEEP_BYTES = 0
    if "static" in levers or "cudagraphs" in levers:
        from agentrl_ray.learner.levers import compilation

        compilation.LAYER_COMPILE_OPTIONS = {"dynamic": False}
        if "cudagraphs" in levers:
            compilation.LAYER_COMPILE_OPTIONS["mode"] = "reduce-overhead"
    if "stack" in levers:
        from agentrl_ray.learner.levers import compilation

        compilation.COMPILE_SCOPE = "stack"
    if "flash" in levers:
        from agentrl_ray.learner.levers import shared_prefix

        shared_prefix.CPU_GEMM_ATTENTION = False
    if "fuse" in levers:
        from agentrl_ray.learner.levers import compilation

        compilation.FUSE_SHARED_INPUT_LINEARS = True


def variant_overrides(device: str, setting: str, levers: list[str], micro: int) -> list[str]:
    """The learner config of a variant, as `load_config` overrides."""
    overrides = [*SETTINGS[device][setting], f"learner.micro_batch_size={micro}", "echo.coeff=0.05"]
    overrides += ["algorithm.beta=0", f"learner.compile={str('compile' in levers).lower()}"]
    overrides += ["learner.shared_prefix=false"] if {"old", "-share"} & set(levers) else []
    overrides += ["learner.shared_prefix=true"] if "share" in levers else []
    overrides += [f"learner.zero_stage={x[-1]}" for x in levers if x.startswith("zero")]
    overrides += [f"learner.compile_buckets={BUCKET}"] if "bucket" in levers else []
    return overrides


def run_variant(args, variant: str, model_dir: Path, out: Path) -> dict:
    """One variant in this process: load, warm up, time `--steps` steps; writes its log-probs to `out`.pt."""
    import torch

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.batching import build_batch, micro_batches
    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.learner.update import update

    setting, *levers = variant.split(".")
    unknown = [x for x in levers if x not in LEVERS]
    if setting not in SETTINGS[args.device] or unknown:
        raise SystemExit(f"unknown variant {variant!r}: settings {list(SETTINGS[args.device])}, levers {LEVERS}")
    if {"static", "cudagraphs", "stack", "fuse", "bucket"} & set(levers) and "compile" not in levers:
        raise SystemExit(
            f"variant {variant!r}: `static`, `cudagraphs`, `stack`, `fuse` and `bucket` change how `compile` compiles"
        )
    apply_levers(levers)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    stand_in_for_ray_train(device)
    micro, n_micro = (16, 1) if "mb16" in levers else (args.micro_batch, args.micro_batches)
    cfg = load_config(None, variant_overrides(args.device, setting, levers, micro))
    shape = shape_config(args.shape)
    groups = batch_groups(args, shape["vocab_size"])
    t0 = time.perf_counter()
    policy = Policy(str(model_dir), cfg.model, cfg.learner, need_reference=False)
    load_s = time.perf_counter() - t0

    full = build_batch(groups, cfg.algorithm, 0, 1 << 20)
    (mb, _), *_ = micro_batches(full, n_micro)
    mb = mb.to(device)
    scored = (mb.action_mask + mb.env_mask) > 0
    with torch.no_grad():
        logp = policy.token_logprobs(mb.input_ids, mb.attention_mask, False, needed=scored)[0]
    torch.save({"logp": logp.float().cpu(), "scored": scored.cpu()}, out.with_suffix(".pt"))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        update(policy, groups, cfg, step=i, pad_id=0)
        sync()
        times.append(time.perf_counter() - t0)
        print(f"{variant}: step {i} {times[-1]:.3f} s", file=sys.stderr, flush=True)  # survives --variant-timeout
    paired = paired_exact_levers(policy, lambda: update(policy, groups, cfg, step=0, pad_id=0), args.paired)
    paired |= paired_keep(lambda: update(policy, groups, cfg, step=0, pad_id=0), args.paired_keep)
    paired |= paired_thread(lambda: update(policy, groups, cfg, step=0, pad_id=0), args.paired_thread)
    paired |= paired_scatter(lambda: update(policy, groups, cfg, step=0, pad_id=0), args.paired_scatter)
    paired |= paired_share(policy, lambda: update(policy, groups, cfg, step=0, pad_id=0), args.paired_share)
    profile, busy, shapes = [], {}, []
    if args.profile:
        profile, busy, shapes = profile_step(lambda: update(policy, groups, cfg, step=0, pad_id=0), args.profile)

    params = dict(policy.module.named_parameters())
    n_lora = sum(p.numel() for n, p in params.items() if "lora_" in n)
    n_head = shape["vocab_size"] * shape["hidden_size"]
    n_body = sum(p.numel() for n, p in params.items() if "lora_" not in n) - n_head  # tied: embedding == head
    tokens = int(full.attention_mask.sum())
    scored_tokens = int(((full.action_mask + full.env_mask)[:, 1:] > 0).sum())
    if cfg.learner.lora.enabled:
        flops = 4 * n_body * tokens + 4 * n_head * scored_tokens + 6 * n_lora * tokens
    else:
        flops = 6 * n_body * tokens + 6 * n_head * scored_tokens
    step_s = statistics.median(times[args.warmup :])
    if busy:  # the profiler slows the host, not the kernels: their time against the unprofiled step
        busy["share_of_step"] = round(busy["kernel_ms"] / 1e3 / step_s, 3)
    return {
        "variant": variant,
        "micro_batches": f"{n_micro} x {micro}",
        "tokens_per_step": tokens,
        "scored_tokens_per_step": scored_tokens,
        "padded_tokens_per_step": int(full.attention_mask.numel()),
        "params_body": n_body,
        "params_head": n_head,
        "params_lora": n_lora,
        "load_s": round(load_s, 2),
        "warmup_step_s": [round(t, 4) for t in times[: args.warmup]],
        "step_s": [round(t, 4) for t in times[args.warmup :]],
        "step_s_median": round(step_s, 4),
        "tokens_per_s": round(tokens / step_s, 1),
        "model_tflops_per_step": round(flops / 1e12, 3),
        "achieved_tflops": round(flops / step_s / 1e12, 2),
        "mfu": round(flops / step_s / 1e12 / args.peak_tflops, 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        # the variant's process, model and all (on a CPU the learner's memory; Linux reports KiB)
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "top_kernels": profile,
        "matmul_shapes": shapes,
        "device_busy": busy,
        **paired,
    }


def paired_exact_levers(policy, step, pairs: int) -> dict:
    """`pairs` steps with the exact eager levers (`-nomask`, `-peftcast`) off and as many on, alternating in this
    process (ABBA order): their few percent are below the spread between processes, not below a step's."""
    if not pairs:
        return {}
    from peft.tuners.tuners_utils import BaseTunerLayer

    from agentrl_ray.learner import policy as policy_module

    right_padded = policy_module.right_padded
    adapters = [m for m in policy.module.modules() if isinstance(m, BaseTunerLayer)]
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(pairs):
        for on in (False, True) if i % 2 == 0 else (True, False):
            policy_module.right_padded = right_padded if on else (lambda mask: False)
            for m in adapters:  # True: PEFT casts the input to the adapter's dtype
                m.cast_input_dtype_enabled = not (on and policy.cfg.bf16)
            t0 = time.perf_counter()
            step()
            times[on].append(round(time.perf_counter() - t0, 4))
    policy_module.right_padded = right_padded
    return {"paired_off_s": times[False], "paired_on_s": times[True]}


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _alternate(step, pairs: int, switch) -> dict[bool, list[float]]:
    """`pairs` pairs of timed steps, `switch(False)` before one and `switch(True)` before the other, in ABBA order
    (the second of each pair of pairs reversed): a lever's few percent against the same process's other setting."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(pairs):
        for on in (False, True) if i % 2 == 0 else (True, False):
            switch(on)
            _sync()
            t0 = time.perf_counter()
            step()
            _sync()
            times[on].append(round(time.perf_counter() - t0, 4))
    return times


def paired_keep(step, pairs: int) -> dict:
    """`pairs` steps with the head's backward recomputing its logits and as many reading the probabilities forward
    kept (chunked_logprobs.KEEP_BYTES), alternating in this process (ABBA order)."""
    if not pairs:
        return {}
    from agentrl_ray.learner.levers import chunked_logprobs

    before = chunked_logprobs.KEEP_BYTES, chunked_logprobs.CUDA_KEEP_BYTES
    budget = before[0] or 1 << 30, before[1] or 8 << 30  # the defaults (also where a caller had set them to 0)

    def switch(on: bool) -> None:
        chunked_logprobs.KEEP_BYTES, chunked_logprobs.CUDA_KEEP_BYTES = budget if on else (0, 0)

    times = _alternate(step, pairs, switch)
    chunked_logprobs.KEEP_BYTES, chunked_logprobs.CUDA_KEEP_BYTES = before
    return {"paired_keep_off_s": times[False], "paired_keep_on_s": times[True]}


def _grad_logits_kept_by_scatter(p, targets, logp, g, temperature: float):
    """The kept-probabilities head gradient as it was before round 6: `scatter_` of the targets' values into the
    bfloat16 (t, V) tensor, which torch's CPU kernel does by converting all of it to float32 and back."""
    import torch

    g = g / temperature
    dz = p.mul(-g.to(p.dtype))
    return dz.scatter_(-1, targets[:, None], (g * -torch.expm1(logp[:, None])).to(p.dtype))


def paired_scatter(step, pairs: int) -> dict:
    """`pairs` steps with the head's kept-probabilities gradient written by `scatter_` (before) and as many by
    `index_put_` (chunked_logprobs now), alternating in this process (ABBA order)."""
    if not pairs:
        return {}
    from agentrl_ray.learner.levers import chunked_logprobs

    current = chunked_logprobs._grad_logits_kept

    def switch(new: bool) -> None:
        chunked_logprobs._grad_logits_kept = current if new else _grad_logits_kept_by_scatter

    times = _alternate(step, pairs, switch)
    chunked_logprobs._grad_logits_kept = current
    return {"paired_scatter_s": times[False], "paired_index_put_s": times[True]}


def paired_share(policy, step, pairs: int) -> dict:
    """`pairs` steps with each micro-batch's shared prefix computed per row and as many with it computed once
    (`learner.shared_prefix`), alternating in this process (ABBA order; the first pair's compiled graphs are each
    built in its own first step)."""
    if not pairs or not policy.shared_prefix:
        return {}
    times = _alternate(step, pairs, lambda on: setattr(policy, "shared_prefix", on))
    policy.shared_prefix = True
    return {"paired_share_off_s": times[False], "paired_share_on_s": times[True]}


def paired_thread(step, pairs: int) -> dict:
    """`pairs` steps in this process's main thread and as many in one long-lived other thread, as Ray Train runs the
    update in a run, alternating (ABBA order). glibc gives that thread heaps of its own (at most 64 MiB each;
    infra/allocator.py). Measured at the quarter 0.5B shape: its first step slower (fresh heaps), the later ones level
    with the main thread's under the run's malloc settings (`--allocator run`), ~10% slower under glibc's defaults."""
    if not pairs:
        return {}
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()

    def worker() -> None:
        while todo.get():
            t0 = time.perf_counter()
            step()
            done.put(round(time.perf_counter() - t0, 4))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(pairs):
        for other in (False, True) if i % 2 == 0 else (True, False):
            if other:
                todo.put(True)
                times[True].append(done.get())
            else:
                t0 = time.perf_counter()
                step()
                times[False].append(round(time.perf_counter() - t0, 4))
    todo.put(False)
    thread.join()
    return {"paired_main_thread_s": times[False], "paired_other_thread_s": times[True]}


def profile_step(step, top: int) -> tuple[list[dict], dict, list[dict]]:
    """One step under torch.profiler: the `top` operations by device (else CPU) self time, the `top` matrix products
    by shape (`matmul_shapes`), and on a GPU how busy it was (`device_busy`: the kernels' summed time, their count,
    and the profiled step's wall time; the profiler slows the host, so run_variant adds `share_of_step`, the kernels'
    time over the unprofiled median step: well under 1 means the step waits on the host: launches, Python, guards,
    synchronisations)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync()
    with profile(activities=activities, record_shapes=True) as prof:
        t0 = time.perf_counter()
        step()
        _sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    averages = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:top]
    busy = {}
    if cuda:
        kernels = [e for e in averages if e.device_type == DeviceType.CUDA]
        kernel_ms = sum(e.self_device_time_total for e in kernels) / 1e3
        busy = {"kernels": sum(e.count for e in kernels), "kernel_ms": round(kernel_ms, 1),
                "wall_ms": round(wall_ms, 1), "busy_share": round(kernel_ms / wall_ms, 3)}  # fmt: skip
    ops = [{"name": e.key[:90], "calls": e.count, "ms": round(getattr(e, key) / 1e3, 2)} for e in events]
    return ops, busy, matmul_shapes(prof, key, top)


def matmul_shapes(prof, key: str, top: int) -> list[dict]:
    """The profiled step's matrix products by input shape, slowest first, with the rate each ran at: which shapes
    fall short of the machine's GEMM rate (roofline --mode machine_peak)."""
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in ("aten::mm", "aten::addmm", "aten::bmm") or not e.input_shapes:
            continue
        a, b = e.input_shapes[1:3] if e.key == "aten::addmm" else e.input_shapes[:2]
        if len(a) < 2 or len(b) < 2:
            continue
        batch = a[0] if e.key == "aten::bmm" else 1
        flops = 2 * batch * a[-2] * a[-1] * b[-1] * e.count
        ms = getattr(e, key) / 1e3
        rows.append({"op": e.key, "a": a, "b": b, "calls": e.count, "ms": round(ms, 2),
                     "gflops": round(flops / ms / 1e6, 1) if ms else None})  # fmt: skip
    return sorted(rows, key=lambda r: r["ms"], reverse=True)[:top]


def matmul_tflops(device: str) -> float | None:
    """This device's bfloat16 matmul rate at 8192^3 (the number an MFU can be read against beside --peak-tflops)."""
    if device != "cuda":
        return None
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return round(20 * 2 * 8192**3 / (time.perf_counter() - t0) / 1e12, 1)


def compare(results: list[dict], folder: Path) -> None:
    """Each variant's log-probs against its setting's first variant, at the scored positions."""
    import torch

    first: dict[str, dict] = {}
    for r in results:
        if not r.get("ok"):
            continue
        mine = torch.load(folder / f"{r['variant']}.pt")
        setting = r["variant"].split(".")[0]
        if setting not in first:
            first[setting] = {"variant": r["variant"], **mine}
            continue
        ref = first[setting]
        if ref["logp"].shape != mine["logp"].shape:  # another micro-batch split (mb16): not the same rows
            continue
        gap = (mine["logp"] - ref["logp"])[ref["scored"]].abs().max()
        r["logprob_gap_vs"] = {ref["variant"]: float(gap)}


def one_line(results: list[dict]) -> str:
    """Each variant's tokens/s and MFU, for the result's meta."""
    return "; ".join(
        f"{r['variant']} {r['tokens_per_s']:,.0f} tok/s, MFU {r['mfu']:.3f}" if r["ok"] else f"{r['variant']} failed"
        for r in results
    )


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shape", choices=("tiny", "0.5b", "1.5b"), default="0.5b")
    p.add_argument("--variants", default="full.old,full,lora.old,lora")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--ragged", action="store_true", help="lengths uniform in [seq/2, seq], right-padded")
    p.add_argument("--min-len", type=int, default=0, help="lengths uniform in [min-len, seq], right-padded")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--profile", type=int, default=0, help="top operations of one profiled step (0: none)")
    p.add_argument("--paired", type=int, default=0, help="then N steps each with -nomask,-peftcast off/on, ABBA")
    p.add_argument("--paired-keep", type=int, default=0, help="then N steps each with -keep off/on, ABBA")
    p.add_argument("--paired-thread", type=int, default=0, help="then N steps each in the main/another thread, ABBA")
    p.add_argument("--paired-share", type=int, default=0, help="then N steps each with shared_prefix off/on, ABBA")
    p.add_argument(
        "--paired-scatter", type=int, default=0, help="then N steps each with the head gradient's scatter_/index_put_"
    )
    p.add_argument(
        "--allocator", choices=("glibc", "run"), default="glibc", help="run: a CPU learner's malloc settings in a run"
    )
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--budget-s", type=float, default=1e9, help="start no variant after this many seconds")
    p.add_argument("--variant-timeout", type=float, help="stop a variant after this many seconds, go on to the next")
    p.add_argument("--out", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:  # one variant, in its own process
        out = Path(args.out)
        out.write_text(json.dumps(run_variant(args, args.child, args.model_dir, out)))
        return

    t_start = time.perf_counter()
    report = {"device": args.device, "shape": args.shape, "seq": args.seq, "ragged": args.ragged}
    report["matmul_tflops"] = matmul_tflops(args.device)
    if args.device == "cuda":
        import torch

        report["gpu"], report["torch"] = torch.cuda.get_device_name(0), torch.__version__
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_model(folder / "model", args.shape, args.device)
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in CHILD_ARGS]
        argv += ["--ragged"] if args.ragged else []
        child_env = dict(os.environ)
        if args.allocator == "run":  # glibc reads these when the process starts (infra/allocator.py)
            from agentrl_ray.infra.allocator import allocator_env

            child_env.update(allocator_env(one_arena=False))
        report["allocator_env"] = {k: v for k, v in child_env.items() if k.startswith("MALLOC_")}
        for variant in args.variants.split(","):
            if time.perf_counter() - t_start > args.budget_s:
                results.append({"variant": variant, "ok": False, "error": "skipped: --budget-s spent"})
                continue
            out = folder / f"{variant}.json"
            cmd = [sys.executable, str(ROOT / "benchmarks" / "learner.py"), "--mode", "learner_throughput", *argv]
            cmd += ["--child", variant, "--model-dir", str(folder / "model")]
            try:
                run = [*cmd, "--out", str(out)]
                proc = subprocess.run(run, capture_output=True, text=True, env=child_env, timeout=args.variant_timeout)
            except subprocess.TimeoutExpired as e:  # its steps so far are in its stderr
                said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
                error = f"timed out after {args.variant_timeout:g} s; its last output:\n{said[-3000:]}"
                results.append({"variant": variant, "ok": False, "error": error})
            else:
                if proc.returncode == 0:
                    results.append({"ok": True, **json.loads(out.read_text())})
                else:
                    results.append({"variant": variant, "ok": False, "error": proc.stderr[-3000:]})
            r = results[-1]
            print(
                f"{variant:28s} "
                + (f"{r['tokens_per_s']:>10,.0f} tok/s  mfu {r['mfu']:.3f}  step {r['step_s_median']:.3f} s  "
                   f"peak {r['peak_mem_gib']} GiB  rss {r.get('peak_rss_gib')} GiB  "
                   f"busy {r['device_busy'].get('share_of_step', '-')}"
                if r["ok"] else "FAILED: " + r["error"][-600:]),
                flush=True,
            )  # fmt: skip
        compare(results, folder)
    report["results"] = results
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(with_meta(report, one_line(results), gpu=report.get("gpu")), indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
