"""Build the BFCL example's data from the installed bfcl-eval package: prompt rows for RL and a supervised warm-up set.

    pip install --no-deps bfcl-eval==2026.3.23
    python examples/bfcl/make_data.py              # data/bfcl/{train,train_ast,eval}.jsonl, data/bfcl/sft/ and
                                                   # data/bfcl/multi_turn/{train,eval,train_math,eval_math}.jsonl, sft/
    python examples/bfcl/make_data.py --out DIR

The default folder is data/bfcl under the repository root, which is where config.yaml's relative paths point when
a command runs from the root (as every command in README.md does, and as a `ray job submit --working-dir .` job
does). Rows and the split are `agentrl_ray.tasks.bfcl.data`'s: 928 training and 312 held-out tasks, a task held
out when crc32(id) % 4 == 0. `train_ast.jsonl` is the training split without its irrelevance tasks (the four
categories that BFCL's AST checker scores: 748 tasks), for RL that trains the calls (docs/real_model.md). `sft/` is a
`datasets.save_to_disk` folder of the training split's reference answers (`agentrl-ray sft data/bfcl/sft ...`), its
tool-call arguments as JSON strings (OpenAI's wire form, what `agentrl-ray traces convert --format sft` writes: Arrow
cannot hold arguments of differing types in one column).

`multi_turn/` holds BFCL's multi_turn_base tasks (`agentrl_ray.tasks.bfcl.multi_turn`, for `multi_turn.yaml`): 151
training and 49 held-out tasks by the same crc32 rule, `*_math.jsonl` the 19 and 6 of them that involve MathAPI,
and `sft/` the training tasks' ground truths as whole conversations (calls, their results, a closing answer per
turn).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentrl_ray.messages import to_openai
from agentrl_ray.tasks.bfcl import multi_turn
from agentrl_ray.tasks.bfcl.data import CATEGORIES, rows, sft_rows

OUT = Path(__file__).resolve().parents[2] / "data" / "bfcl"
AST_CATEGORIES = tuple(c for c in CATEGORIES if c != "irrelevance")  # what BFCL's AST checker scores


def write(out_dir: Path = OUT) -> dict[str, Path]:
    """Write train.jsonl, eval.jsonl and the sft/ dataset folder under `out_dir`; returns their paths."""
    from datasets import Dataset

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    train = rows("train")
    splits = {"train": train, "eval": rows("eval")}
    splits["train_ast"] = [row for row in train if row["category"] in AST_CATEGORIES]
    for name, split_rows in splits.items():
        paths[name] = out_dir / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(row) + "\n" for row in split_rows))
    paths["sft"] = out_dir / "sft"
    conversations = [{**r, "messages": to_openai(r["messages"])} for r in sft_rows("train")]
    Dataset.from_list(conversations).save_to_disk(str(paths["sft"]))
    turns = out_dir / "multi_turn"
    turns.mkdir(exist_ok=True)
    for split in ("train", "eval"):
        for suffix, classes in (("", ()), ("_math", ("MathAPI",))):
            name = f"multi_turn_{split}{suffix}"
            paths[name] = turns / f"{split}{suffix}.jsonl"
            paths[name].write_text("".join(json.dumps(row) + "\n" for row in multi_turn.rows(split, classes)))
    paths["multi_turn_sft"] = turns / "sft"
    conversations = [{**r, "messages": to_openai(r["messages"])} for r in multi_turn.sft_rows("train")]
    Dataset.from_list(conversations).save_to_disk(str(paths["multi_turn_sft"]))
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: %(default)s)")
    args = parser.parse_args()
    for name, path in write(args.out).items():
        print(f"{name}: {path}")
