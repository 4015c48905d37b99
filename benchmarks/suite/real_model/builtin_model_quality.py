"""Initial quality of the built-in model, measured the way rollouts see it: vLLM, token ids in and out.

    python benchmarks/run.py real_model --mode builtin_model_quality         # CPU: builds the model if needed, ~1 min
    python benchmarks/run.py real_model --mode builtin_model_quality --n 500 # more held-out prompts
    python benchmarks/run.py real_model --mode builtin_model_quality --model /path/to/checkpoint/model   # a checkpoint

On a GPU machine the same command runs vLLM on the GPU. For each held-out arithmetic prompt it samples one
trajectory at temperature 1 (the RL sampling temperature) and one greedy, runs the multi-turn tool loop exactly
like `rollout/agent_loop.py` (same prompt ids, same tool-result segments, same tool-call parser), and prints as JSON:

- success: the final answer equals the right number (what the `answer_match` reward pays for);
- tool-call rate: the first turn calls the calculator;
- tool-conditional success: success among trajectories that called it (the copy skill RL relies on);
- expression copied: the call's expression is exactly the question's.

The built-in model is meant to start with a low but non-zero sampled success (10-40%), a tool-conditional success
of at least 90%, and greedy success near 0 (greedy never calls the tool), which leaves RL one decision to learn.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from results_path import with_meta

from agentrl_ray.builtin.model import calculator_tools, ensure_builtin_model
from agentrl_ray.chat_format import encode_segments, extract_final_answer, parse_tool_calls, tool_response_segments
from agentrl_ray.tasks.arithmetic import make_arithmetic_rows


def run_episodes(engine, tokenizer, tools, calculator, rows, *, temperature, max_turns, max_tokens, seed):
    """Multi-turn tool loop over all rows at once; returns one record per row."""
    eos = tokenizer.eos_token_id
    ids = [
        list(tokenizer.apply_chat_template(r["prompt"], tools=tools, add_generation_prompt=True, return_dict=False))
        for r in rows
    ]
    records = [{"turns": [], "calls": [], "done": False} for _ in rows]
    for turn in range(max_turns):
        live = [i for i, rec in enumerate(records) if not rec["done"]]
        if not live:
            break
        gens = engine.generate(
            [ids[i] for i in live],
            [max_tokens] * len(live),
            temperature=temperature,
            top_p=1.0,
            stop_token_ids=[eos],
            seeds=[seed * 100_003 + i * 7 + turn for i in live],
        )
        for i, gen in zip(live, gens):
            rec = records[i]
            ids[i] += gen.token_ids
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=False).removesuffix(tokenizer.eos_token)
            rec["turns"].append(text)
            parsed = parse_tool_calls(text)
            if gen.finish_reason == "length" or not (parsed.calls or parsed.errors) or turn == max_turns - 1:
                rec["done"] = True
                continue
            results = [_call(calculator, c) for c in parsed.calls]
            results += [f"Error: {e}" for e in parsed.errors]
            rec["calls"] += [c.arguments for c in parsed.calls]
            ids[i] += encode_segments(tokenizer, tool_response_segments(results))[0]
    for rec, row in zip(records, rows):
        final = rec["turns"][-1]
        rec["success"] = not parse_tool_calls(final).calls and extract_final_answer(final) == row["answer"]
    return records


def _call(calculator, call) -> str:
    """A tool call's result text; a failing call gets an error text, as our env host gives it (envs/host.py)."""
    if call.name != "calculator":
        return f"Error: unknown tool {call.name!r}"
    try:
        return calculator(**call.arguments)
    except Exception as e:  # noqa: BLE001 - the model's bad call is an observation, not a crash
        return f"Error: {e}"


def summarize(records, rows) -> dict[str, float]:
    called = [r for r in records if r["calls"]]
    question = [row["prompt"][-1]["content"].removeprefix("What is ").removesuffix("?") for row in rows]
    copied = [r["calls"][0].get("expression") == q for r, q in zip(records, question) if r["calls"]]
    return {
        "success": sum(r["success"] for r in records) / len(records),
        "tool_call_rate": len(called) / len(records),
        "tool_conditional_success": sum(r["success"] for r in called) / max(1, len(called)),
        "expression_copied": sum(copied) / max(1, len(copied)),
        "num_tool_calls": len(called),
    }


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: the built-in model, built if needed)")
    p.add_argument("--n", type=int, default=200, help="held-out prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48, help="per turn")
    args = p.parse_args(argv)

    from agentrl_ray.rollout.vllm_engine import VLLMEngine, vllm_env

    use_gpu = torch.cuda.is_available()
    os.environ.update(vllm_env(use_gpu=use_gpu))
    torch.set_num_threads(os.cpu_count() or 1)
    from transformers import AutoTokenizer

    from agentrl_ray.envs.builtin.calculator import CalculatorEnv

    t0 = time.perf_counter()
    path = args.model or str(ensure_builtin_model())
    build_s = time.perf_counter() - t0
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(
        path,
        dtype="float32",
        seed=args.seed,
        max_model_len=320,
        max_num_seqs=256,
        enforce_eager=not use_gpu,
        gpu_memory_utilization=0.5,
        use_gpu=use_gpu,
    )
    tools = calculator_tools()
    env = CalculatorEnv()
    rows = make_arithmetic_rows(args.n, args.seed, "eval")
    report: dict[str, object] = {"model": path, "n": args.n, "build_or_load_s": round(build_s, 1)}
    for name, temperature in (("sampled_T1", 1.0), ("greedy", 0.0)):
        t0 = time.perf_counter()
        records = run_episodes(
            engine,
            tokenizer,
            tools,
            env.calculator,
            rows,
            temperature=temperature,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        report[name] = {k: round(v, 3) for k, v in summarize(records, rows).items()}
        report[name]["seconds"] = round(time.perf_counter() - t0, 1)
        report[f"{name}_examples"] = [r["turns"] for r in records[:3]]
    sampled, greedy = report["sampled_T1"], report["greedy"]
    summary = (
        f"{args.n} held-out prompts: success {sampled['success']} sampled at T=1 (tool-call rate "
        f"{sampled['tool_call_rate']}, tool-conditional {sampled['tool_conditional_success']}), "
        f"{greedy['success']} greedy"
    )
    gpu = torch.cuda.get_device_name(0) if use_gpu else None
    print(json.dumps(with_meta(report, summary, gpu=gpu), indent=2))
