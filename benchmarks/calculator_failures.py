"""Where a calculator checkpoint's held-out errors come from: no tool call, a wrong expression in the call, or the
tool's right result copied wrong. `transformers` only (no Ray, no vLLM), one conversation at a time, the rollout's
token layout (`chat_format`), the run's held-out questions (200, seed 0).

    python benchmarks/calculator_failures.py runs/calculator/checkpoint_000050/model --temperature 0
    python benchmarks/calculator_failures.py runs/calculator/checkpoint_000050/model --temperature 1 --samples 2
    python benchmarks/calculator_failures.py MODEL --force-call    # the warm-up's copy skill: every answer via the tool

Numbers in docs/default_run.md ("Where the errors are").
"""

from __future__ import annotations

import argparse
import collections

import torch

from agentrl_ray.chat_format import encode_segments, extract_final_answer, parse_tool_calls, tool_response_segments
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.rewards.builtin import numbers_match
from agentrl_ray.tasks.arithmetic import make_arithmetic_rows

MAX_TURNS, MAX_TOKENS = 3, 48  # examples/calculator/config.yaml's rollout


def generate(model, ids: list[int], eos: int, temperature: float) -> list[int]:
    out: list[int] = []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            probs = torch.softmax(logits / max(temperature, 1e-6), -1)
            out.append(int(logits.argmax()) if temperature == 0 else int(torch.multinomial(probs, 1)))
            if out[-1] == eos:
                break
    return out


def episode(model, tok, row, temperature: float, force_call: bool) -> tuple[str, list[str]]:
    """(verdict, the turns) of one conversation."""
    tools, eos = tool_schemas(CalculatorEnv), tok.convert_tokens_to_ids("<|im_end|>")
    ids = list(tok.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True, return_dict=False))
    turns, result = [], None
    for turn in range(MAX_TURNS):
        prefix = [tok.convert_tokens_to_ids("<tool_call>")] if force_call and turn == 0 else []
        new = prefix + generate(model, ids + prefix, eos, temperature)
        ids += new
        text = tok.decode(new).removesuffix("<|im_end|>")
        turns.append(text)
        parsed = parse_tool_calls(text)
        if not parsed.calls and not parsed.errors:
            break
        if parsed.errors or turn == MAX_TURNS - 1:
            return "malformed or unfinished tool call", turns
        try:
            result = CalculatorEnv().calculator(**parsed.calls[0].arguments)
        except (TypeError, ValueError) as e:
            result = f"error: {e}"
        turns.append(f"[tool] {result}")
        ids += encode_segments(tok, tool_response_segments([result]))[0]
    if numbers_match(extract_final_answer(parse_tool_calls(turns[-1]).content), row["answer"]):
        return "right", turns
    if result is None:
        return "no tool call (answered from memory)", turns
    if result != row["answer"]:
        return "wrong expression in the tool call", turns
    return "right tool result copied wrong", turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a Hugging Face model folder (a checkpoint's model/, or the built-in model's)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--force-call", action="store_true", help="start every answer with <tool_call>")
    p.add_argument("--show", type=int, default=4, help="examples shown per kind of error")
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    verdicts: collections.Counter[str] = collections.Counter()
    examples = collections.defaultdict(list)
    for row in make_arithmetic_rows(200, 0, "eval"):
        for _ in range(args.samples):
            verdict, turns = episode(model, tok, row, args.temperature, args.force_call)
            verdicts[verdict] += 1
            examples[verdict].append((row["prompt"][0]["content"], row["answer"], turns))
    n = sum(verdicts.values())
    print(f"{n} conversations at temperature {args.temperature:g}: success {verdicts['right'] / n:.3f}")
    for verdict, count in verdicts.most_common():
        print(f"  {verdict}: {count} ({count / n:.3f})")
        if verdict != "right":
            for question, answer, turns in examples[verdict][: args.show]:
                print(f"      {question} (answer {answer}): {' | '.join(t.replace(chr(10), ' ') for t in turns)}")


if __name__ == "__main__":
    main()
