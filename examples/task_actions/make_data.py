"""Build the task_actions example's data: household tasks done by naming actions (`ACTION: boil_water`).

    python examples/task_actions/make_data.py           # writes examples/task_actions/data/{train,eval}.jsonl
    python examples/task_actions/make_data.py --out DIR

Rows are what `ActionTaskEnv` reads: `required_actions`, `actions` (the valid ones: the required ones plus a few
distractors) and `ordered`. The environment appends the list of valid actions to the prompt. Six tasks train and
two different tasks are held out, so `eval/success` measures doing a task never trained on.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data"
NUM_TRAIN, NUM_EVAL = 512, 32  # 512: any power-of-two prompts_per_step divides it (no repeats within a step)

# goal -> (required actions, must they happen in this order)
TRAIN_TASKS = {
    "make tea": (["boil_water", "put_tea_bag_in_cup", "pour_water"], True),
    "water the plants": (["fill_watering_can", "water_plants"], True),
    "send a letter": (["write_letter", "put_letter_in_envelope", "stick_stamp", "post_letter"], True),
    "get ready to leave the house": (["switch_off_lights", "close_windows", "take_keys"], False),
    "do the laundry": (["load_washer", "add_detergent", "start_washer", "hang_clothes"], True),
    "feed the cat": (["open_cat_food", "fill_bowl"], True),
}
EVAL_TASKS = {
    "pack for a trip": (["pack_clothes", "pack_toothbrush", "pack_charger"], False),
    "make toast": (["put_bread_in_toaster", "start_toaster", "butter_toast"], True),
}
DISTRACTORS = ["watch_tv", "take_nap", "check_phone", "open_fridge", "sweep_floor", "read_book", "call_friend"]


def task_row(rng: random.Random, goal: str, required: list[str], ordered: bool) -> dict:
    distractors = rng.sample(DISTRACTORS, rng.randint(2, 4))
    order = "in the right order" if ordered else "in any order"
    return {
        "prompt": f"Task: {goal}. Do it by taking the actions it needs, {order}.",
        "required_actions": required,
        "actions": sorted(required + distractors),
        "ordered": ordered,
    }


def make_rows(seed: int = 0) -> dict[str, list[dict]]:
    """Train rows from TRAIN_TASKS, eval rows from EVAL_TASKS (distractors drawn from a seed)."""
    rng = random.Random(seed)
    rows: dict[str, list[dict]] = {}
    for split, tasks, n in (("train", TRAIN_TASKS, NUM_TRAIN), ("eval", EVAL_TASKS, NUM_EVAL)):
        goals = sorted(tasks)
        rows[split] = [
            {"id": f"task-{split}-{i:04d}", **task_row(rng, goals[i % len(goals)], *tasks[goals[i % len(goals)]])}
            for i in range(n)
        ]
    return rows


def write(out_dir: Path = OUT, seed: int = 0) -> dict[str, Path]:
    """Write train.jsonl and eval.jsonl under `out_dir`; returns their paths by split."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in make_rows(seed).items():
        paths[split] = out_dir / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for split, path in write(args.out, args.seed).items():
        print(f"{split}: {path}")
