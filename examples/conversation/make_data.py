"""Build the conversation example's data: multi-turn "running total" chats with a scripted user.

    python examples/conversation/make_data.py           # writes examples/conversation/data/{train,eval}.jsonl
    python examples/conversation/make_data.py --out DIR

The user starts a running total, then changes it once or twice ("Now double it."); after each of its turns the
assistant must state the new total as `Total: N`. Rows are what `ScriptedUserEnv` reads: `expected` (per assistant
turn, text the reply must contain) and `user_turns` (the user's follow-ups between those turns). The questions are
generated from a seed, and the held-out split never repeats a training conversation.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data"
NUM_TRAIN, NUM_EVAL = 1024, 64  # 1024: any power-of-two prompts_per_step divides it (no repeats within a step)


def _change(rng: random.Random, total: int) -> tuple[str, int]:
    """A change to the total, as the user says it, and the new total."""
    kind = rng.choice(["add", "subtract", "double"])
    if kind == "double":
        return "double it", 2 * total
    n = rng.randint(2, 30)
    return (f"add {n}", total + n) if kind == "add" else (f"subtract {n}", total - n)


def conversation(rng: random.Random) -> dict:
    """One conversation: a start and 2-3 changes, each followed by the total the assistant must state."""
    start = rng.randint(1, 50)
    first, total = _change(rng, start)
    prompt = (
        f"Let's keep a running total. Start at {start} and {first}. "
        "After each of my messages, reply with the new total as 'Total: <number>'."
    )
    expected, user_turns = [f"Total: {total}"], []
    for _ in range(rng.randint(1, 2)):
        change, total = _change(rng, total)
        user_turns.append(f"Now {change}.")
        expected.append(f"Total: {total}")
    return {"prompt": prompt, "expected": expected, "user_turns": user_turns}


def make_rows(seed: int = 0) -> dict[str, list[dict]]:
    """Train and eval rows; an eval conversation never has the same prompt as a training one."""
    rng = random.Random(seed)
    rows: dict[str, list[dict]] = {"train": [], "eval": []}
    seen: set[str] = set()
    for split, n in (("eval", NUM_EVAL), ("train", NUM_TRAIN)):
        while len(rows[split]) < n:
            row = conversation(rng)
            if row["prompt"] in seen:
                continue
            seen.add(row["prompt"])
            rows[split].append({"id": f"chat-{split}-{len(rows[split]):04d}", **row})
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
