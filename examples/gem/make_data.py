"""Build the GEM example's rows: one GEM game per row, named by its seed.

    python examples/gem/make_data.py           # writes examples/gem/data/{train,eval}.jsonl
    python examples/gem/make_data.py --out DIR

A row is a `seed` (GEM's `reset(seed)` picks the game: the hidden number of GuessTheNumber), an `id`, and a short
prompt; GEM's own rules are appended to it by the environment's `reset`. The held-out seeds never meet a training one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data"
NUM_TRAIN, NUM_EVAL = 512, 64
EVAL_SEED0 = 1_000_000  # held-out seeds start here; training seeds are 0..NUM_TRAIN-1
PROMPT = "Let's play a game. Think briefly, then give your guess as \\boxed{N}."


def rows(seeds: range, split: str) -> list[dict]:
    return [{"id": f"{split}-{s}", "seed": s, "prompt": PROMPT} for s in seeds]


def write(out: Path = OUT) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.jsonl", "eval": out / "eval.jsonl"}
    splits = {"train": rows(range(NUM_TRAIN), "train"), "eval": rows(range(EVAL_SEED0, EVAL_SEED0 + NUM_EVAL), "eval")}
    for split, path in paths.items():
        path.write_text("".join(json.dumps(r) + "\n" for r in splits[split]))
    return paths


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    for split, path in write(ap.parse_args().out).items():
        print(f"{split}: {path}")
