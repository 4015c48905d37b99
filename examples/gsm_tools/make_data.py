"""Build the gsm_tools example's data: reasoning-gym questions for RL and worked calculator solutions for a warm start.

    python examples/gsm_tools/make_data.py                         # chain_sum -> data/gsm_tools/chain_sum/
    python examples/gsm_tools/make_data.py --dataset gsm_symbolic  # -> data/gsm_tools/gsm_symbolic/
    python examples/gsm_tools/make_data.py --train 2048 --eval 400 --sft 512 --seed 0 --out DIR

Writes, under data/gsm_tools/<dataset>/ of the working directory (the paths the configs read):
- train.jsonl, eval.jsonl: rows of `agentrl_ray.tasks.gsm` (prompt, answer, id, dataset, rg_entry), from different
  generator seeds and disjoint question texts (the module's docstring says how and what overlap it removes);
- sft/: a `datasets` folder for `agentrl-ray sft`: `messages` + `tools` conversations (and the row's `id` and
  `rg_entry`) from the train split only, in which every arithmetic step is a calculator call whose tool message is
  `CalculatorEnv`'s real answer, and the last turn gives the answer ("The answer is 23."), which `rg_score` scores
  1.0. A question whose solution cannot be worked that way is skipped and counted by reason (printed).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl_ray.chat_format import extract_final_answer
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.rewards.builtin import numbers_match
from agentrl_ray.tasks.gsm import DATASETS, Step, entries, make_rows, row_of, threshold_score, worked_turns

DEFAULT_DATASET = "chain_sum"
OUT = Path.cwd() / "data" / "gsm_tools" / DEFAULT_DATASET
TOOLS = json.dumps(tool_schemas(CalculatorEnv))


def conversation(row: dict[str, Any], turns: list[list[Step]], env: CalculatorEnv) -> dict[str, Any]:
    """The SFT row of a worked solution: ValueError when a result differs from the solution or misses the answer."""
    messages = [*row["prompt"]]
    result = ""
    for t, turn in enumerate(turns):
        calls = [_call(f"call_{t}_{i}", step.expression) for i, step in enumerate(turn)]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        for call, step in zip(calls, turn, strict=True):
            try:
                result = env.calculator(step.expression)
            except ValueError as e:  # e.g. an unbalanced parenthesis read off the solution
                raise ValueError(f"the calculator refuses a step: {e}") from None
            if not numbers_match(result, step.value):
                raise ValueError(
                    f"a result differs from the solution's: {result} for {step.expression}, not {step.value:g}"
                )
            messages.append({"role": "tool", "name": "calculator", "tool_call_id": call["id"], "content": result})
    messages.append({"role": "assistant", "content": f"The answer is {result}."})
    if threshold_score(extract_final_answer(messages[-1]["content"]), row["rg_entry"]) != 1.0:
        raise ValueError(f"the worked answer is not the entry's: {result}, not {row['answer']}")
    return {"messages": messages, "tools": TOOLS, "id": row["id"], "rg_entry": row["rg_entry"]}


def _call(call_id: str, expression: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": expression}},
    }


def sft_rows(dataset: str, n: int, seed: int = 0) -> tuple[list[dict[str, Any]], Counter]:
    """`n` worked conversations of the train split, and the questions skipped on the way, counted by reason."""
    env = CalculatorEnv()
    rows: list[dict[str, Any]] = []
    skipped: Counter = Counter()
    for index, entry in entries(dataset, "train", seed):
        if len(rows) == n:
            break
        row = row_of(dataset, "train", seed, index, entry)
        try:
            rows.append(conversation(row, worked_turns(entry), env))
        except ValueError as e:  # every reason reads "what went wrong: the details"
            skipped[str(e).split(":")[0]] += 1
    return rows, skipped


def write(
    out_dir: Path = OUT,
    dataset: str = DEFAULT_DATASET,
    n_train: int = 2048,
    n_eval: int = 400,
    n_sft: int = 512,
    seed: int = 0,
) -> dict[str, Path]:
    """Write train.jsonl, eval.jsonl and sft/ under `out_dir`; returns their paths."""
    from datasets import Dataset  # a slow import, for the script only

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train": out_dir / "train.jsonl", "eval": out_dir / "eval.jsonl", "sft": out_dir / "sft"}
    for split, n in (("train", n_train), ("eval", n_eval)):
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in make_rows(dataset, n, split, seed)))
    rows, skipped = sft_rows(dataset, n_sft, seed)
    Dataset.from_list(rows).save_to_disk(str(paths["sft"]))
    tried = len(rows) + sum(skipped.values())
    print(f"sft: {len(rows)} worked solutions of {tried} train questions; skipped: {dict(skipped) or 'none'}")
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default=DEFAULT_DATASET)
    parser.add_argument("--out", type=Path, help="output folder (default: data/gsm_tools/<dataset>)")
    parser.add_argument("--train", type=int, default=2048, help="train rows (default: %(default)s)")
    parser.add_argument("--eval", type=int, default=400, help="held-out rows (default: %(default)s)")
    parser.add_argument("--sft", type=int, default=512, help="worked conversations (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        paths = write(
            args.out or Path("data") / "gsm_tools" / args.dataset,
            args.dataset,
            args.train,
            args.eval,
            args.sft,
            args.seed,
        )
    except ModuleNotFoundError as e:  # reasoning-gym is not installed: the message names the command
        raise SystemExit(str(e)) from None
    for name, path in paths.items():
        print(f"{name}: {path}")
