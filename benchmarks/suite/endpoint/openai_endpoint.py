"""What the OpenAI-compatible endpoint (`rollout/endpoint/`) costs per call and per token, against calling the engine.

    python benchmarks/run.py endpoint                     # torch backend, built-in tiny model, CPU
    python benchmarks/run.py endpoint --backend vllm      # the vLLM engine (CPU or CUDA, as installed)

The same requests both ways: the calculator agent's first prompt (its tools rendered by the chat template), one
seed per request, so that both ways sample the same tokens (the endpoint's ids and log-probs are the engine's; the
test `tests/unit/test_openai_endpoint.py` checks that). Two shapes:
- sequential: one request at a time, the real `openai.AsyncOpenAI` client over HTTP on 127.0.0.1 against
  `engine.generate` of one prompt; overhead = endpoint time - engine time, fitted as a + b * completion tokens
  (least squares over requests of varied length: max_tokens 1 to 48);
- concurrent: N trajectories' calls at once (they become one engine batch) against one `generate` of N prompts.
Results are printed and written to benchmarks/results/openai_endpoint/<backend>-<date>-<machine>.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
import zlib
from pathlib import Path

from results_path import default_out, with_meta

QUESTIONS = [f"What is {a} * {b}?" for a, b in [(347, 29), (12, 7), (901, 3), (45, 66), (5, 5), (88, 19)]]


def make_engine(backend: str, path: str):
    import os

    from agentrl_ray.config import ModelConfig, RolloutConfig
    from agentrl_ray.rollout.backends import engine_process_env
    from agentrl_ray.rollout.backends import make_engine as make
    from agentrl_ray.rollout.engine_modes import EngineModes

    os.environ.update(engine_process_env(backend, use_gpu=False))  # what a rollout worker's process gets from Ray

    cfg = RolloutConfig(backend=backend, max_total_tokens=320)
    return make(backend, path, ModelConfig(), cfg, seed=0, use_gpu=False, modes=EngineModes(), kv_sequences=32)


async def measure(args) -> dict:
    import openai
    from transformers import AutoTokenizer

    from agentrl_ray.builtin.model import ensure_builtin_model
    from agentrl_ray.config import RolloutConfig
    from agentrl_ray.rollout.endpoint.server import Endpoint
    from examples.openai_agent.agent import TOOLS

    path = str(ensure_builtin_model())
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = make_engine(args.backend, path)
    endpoint = Endpoint(engine, tokenizer, RolloutConfig(backend=args.backend, max_turns=10**6), lambda: 0)
    base_url = await endpoint.start()
    eos = tokenizer.eos_token_id

    def direct(prompts, budgets, seeds):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, budgets, temperature=1.0, top_p=1.0, stop_token_ids=[eos], seeds=seeds)
        return time.perf_counter() - t0, gens

    clients: dict[str, openai.AsyncOpenAI] = {}

    def client_of(key):  # made before the clock starts: an agent makes its client once per trajectory
        clients[key] = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)

    async def via_endpoint(key, question, budget):
        client = clients.pop(key)
        messages = [{"role": "user", "content": question}]
        t0 = time.perf_counter()
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=budget, extra_body={"return_token_ids": True}
        )
        return time.perf_counter() - t0, reply

    rows = []
    for i in range(args.requests):
        key, question, budget = f"seq-{i}", QUESTIONS[i % len(QUESTIONS)], [1, 8, 16, 32, 48][i % 5]
        endpoint.open(key, 1.0, 0)
        client_of(key)
        t_end, reply = await via_endpoint(key, question, budget)
        endpoint.finish(key)
        seed = zlib.crc32(f"0/{key}/0/0".encode())
        t_dir, gens = direct([reply.model_extra["prompt_token_ids"]], [budget], [seed])
        ids = reply.choices[0].model_extra["token_ids"]
        assert gens[0].token_ids == ids, "the endpoint sampled other tokens than the engine"
        if i >= args.warmup:
            rows.append((len(ids), t_end, t_dir))
    n = [r[0] for r in rows]
    over = [r[1] - r[2] for r in rows]
    slope, intercept = statistics.linear_regression(n, over)

    conc = []
    for rep in range(args.repeats):
        keys = [f"conc-{rep}-{j}" for j in range(args.concurrency)]
        for k in keys:
            endpoint.open(k, 1.0, 0)
            client_of(k)
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(via_endpoint(k, QUESTIONS[j % 6], 48) for j, k in enumerate(keys)))
        t_end = time.perf_counter() - t0
        for k in keys:
            endpoint.finish(k)
        prompts = [r.model_extra["prompt_token_ids"] for _, r in replies]
        seeds = [zlib.crc32(f"0/{k}/0/0".encode()) for k in keys]
        t_dir, _ = direct(prompts, [48] * len(keys), seeds)
        tokens = sum(r.usage.completion_tokens for _, r in replies)
        conc.append({"endpoint_s": t_end, "engine_s": t_dir, "completion_tokens": tokens})

    result = {
        "backend": args.backend,
        "machine": f"{platform.processor() or platform.machine()}, {platform.node()}",
        "sequential": {
            "requests": len(rows),
            "overhead_per_call_ms": intercept * 1e3,
            "overhead_per_token_ms": slope * 1e3,
            "median_engine_ms": statistics.median(r[2] for r in rows) * 1e3,
            "median_endpoint_ms": statistics.median(r[1] for r in rows) * 1e3,
            "median_completion_tokens": statistics.median(n),
        },
        "concurrent": {
            "trajectories": args.concurrency,
            "median_endpoint_s": statistics.median(c["endpoint_s"] for c in conc),
            "median_engine_s": statistics.median(c["engine_s"] for c in conc),
            "median_completion_tokens": statistics.median(c["completion_tokens"] for c in conc),
        },
    }
    return result


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "vllm"])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="JSON result (default: benchmarks/results/openai_endpoint/)")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args))
    print(json.dumps(result, indent=2))
    out = args.out or default_out("openai_endpoint", label=args.backend)
    out.parent.mkdir(parents=True, exist_ok=True)
    seq, conc = result["sequential"], result["concurrent"]
    summary = (
        f"{args.backend}: {seq['overhead_per_call_ms']:.2f} ms a call + {seq['overhead_per_token_ms']:.3f} ms a token "
        f"over the engine; {conc['trajectories']} at once {conc['median_endpoint_s']:.2f} s against "
        f"{conc['median_engine_s']:.2f} s"
    )
    out.write_text(json.dumps(with_meta(result, summary), indent=2) + "\n")
    print("written to", out)
