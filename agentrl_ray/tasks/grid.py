"""The grid task: walk from a start cell to a goal cell with `move(direction)` (`envs.builtin.grid.GridEnv`).

The grid's dynamics live here too (`step`, `observation`), shared by `envs.builtin.grid.GridEnv` and the warm-up walks.
Prompts read "You are at 1,3. Go to 3,2: 2 east 1 south." with the goal 1 to 3 moves away (Manhattan distance) on a
5 x 5 grid; every observation gives the new cell and where the goal now lies ("at 2,3, goal 1 east 1 south"). Rows
carry `start` and `goal` ("x,y") for the environment. Train and eval (start, goal) pairs never overlap: a pair belongs
to the eval split when a hash of its prompt falls in the eval bucket (1 in 8), so the warm-up of the
`builtin:tiny-grid` model (train split only) never sees a held-out pair. There are few pairs (~45 held out), so a
split asked for more rows than it has cycles through them (ids stay distinct).

The warm-up dialogues (`warmup_messages`) walk at random: each move goes toward the goal with probability `toward`
(one of the directions that shorten the distance) and is otherwise uniform over the four directions; the walk stops
with "Done." as soon as an observation says "goal", and gives up after `MAX_MOVES` moves. The warm-started model
knows the tool format and when to stop, not which direction brings it closer: RL has that to learn.

Observations come in two wordings (`OBSERVATIONS`), chosen by `GridEnv(observations=...)` and by the warm-up recipe
(`builtin:tiny-grid` "offset", `builtin:tiny-grid-cells` "cell"); the prompt states the offset in both:
- "offset" (the default): every observation also states where the goal now lies ("at 2,3, goal 1 east 1 south"),
  so the next move can be read off the last observation.
- "cell": observations give the new cell only ("at 2,3", "blocked, at 0,3", "at 3,2 goal"). After the first move the
  offset left is stated nowhere: the policy must track it through its own moves and the blocked ones, which is what
  predicting the observations (the cell each move leads to, and when it is the goal) teaches. The tiny model's
  warm-up did not learn to follow the prompt on this wording (docs/history/echo.md, round 5).
- "delayed": each observation says whether the move went through and reports the walker one move late, where it was
  before the move ("moved, before: at 1,3, goal 2 east 1 south"; "blocked, before: ..."). Where the walker is now,
  and whether it stands on the goal, is the next observation: the policy must predict it (apply its last move to the
  last report) to choose the next move or to stop, and predicting the next observation is what ECHO trains.
  builtin:tiny-grid-delayed, examples/grid/delayed.yaml, docs/history/echo.md round 5.

Why the offset is spelled out (TEXT_VERSION 2): with cells only ("Go to 3,2", "at 2,3"), the 0.44M model never
learned to compare coordinates: its first move did not depend on the goal even after warm-ups biased toward it,
and GRPO stayed flat (docs/echo.md, rounds 1-3). With the offset, choosing a move is reading a word of the latest
observation, and predicting the next observation (ECHO) is learning what each move does to the offset and the cell.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

SIZE = 5  # cells 0..SIZE-1 on each axis
# The wording of prompts and observations, part of `builtin:tiny-grid`'s cache key (the model is warm-started on it).
# 2: both state the goal's offset ("2 east 1 south"); 1 gave cells only, which the tiny model could not compare.
TEXT_VERSION = 2
OBSERVATIONS = ("offset", "cell", "delayed")  # what an observation states besides the cell: see the module's docstring
DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}


def parse_cell(value: Any, what: str) -> tuple[int, int]:
    """A cell from "x,y" or [x, y]; ValueError naming `what` if it is not a cell of the grid."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        x, y = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a cell 'x,y' or [x, y], got {value!r}") from None
    if not (0 <= x < SIZE and 0 <= y < SIZE):
        raise ValueError(f"{what} {value!r} is off the {SIZE} x {SIZE} grid (cells 0..{SIZE - 1})")
    return x, y


def cell_text(cell: tuple[int, int]) -> str:
    return f"{cell[0]},{cell[1]}"


def step(cell: tuple[int, int], direction: str) -> tuple[tuple[int, int], bool]:
    """(next cell, blocked): the grid's whole dynamics, shared by the environment and the warm-up dialogues."""
    dx, dy = DIRECTIONS[direction]
    x, y = cell[0] + dx, cell[1] + dy
    if not (0 <= x < SIZE and 0 <= y < SIZE):
        return cell, True
    return (x, y), False


def offset_text(cell: tuple[int, int], goal: tuple[int, int]) -> str:
    """Where the goal lies from `cell`, axis by axis: "2 east 1 south", "1 north" (an axis already right is left
    out)."""
    dx, dy = goal[0] - cell[0], goal[1] - cell[1]
    parts = [f"{abs(dx)} {'east' if dx > 0 else 'west'}"] if dx else []
    parts += [f"{abs(dy)} {'north' if dy > 0 else 'south'}"] if dy else []
    return " ".join(parts)


def observation(
    cell: tuple[int, int], blocked: bool, goal: tuple[int, int], observe: str = "offset", before: Cell | None = None
) -> str:
    """ "at 2,3, goal 1 east 1 south", "blocked, at 0,3, goal 2 north", or "at 3,2 goal" once there; with `observe`
    "cell", the cell only: "at 2,3", "blocked, at 0,3", "at 3,2 goal"; with "delayed", the cell `before` the move:
    "moved, before: at 1,3, goal 2 east 1 south", "blocked, before: at 0,3, goal 2 north", "moved, before: at 3,2
    goal" (the walker has just stepped off the goal)."""
    if observe == "delayed":
        if before is None:
            raise ValueError("delayed observations need the cell before the move")
        return ("blocked" if blocked else "moved") + ", before: " + observation(before, False, goal)
    where = ("blocked, " if blocked else "") + "at " + cell_text(cell)
    if cell == goal:
        return where + " goal"
    return where if observe == "cell" else where + ", goal " + offset_text(cell, goal)


def check_observe(observe: str) -> str:
    if observe not in OBSERVATIONS:
        raise ValueError(f"grid observations must be one of {OBSERVATIONS}, got {observe!r}")
    return observe


MIN_DISTANCE, MAX_DISTANCE = 1, 3
MAX_MOVES = 5  # the warm-up walker's patience; the example's rollout.max_turns is MAX_MOVES + 1
EVAL_BUCKETS = 8
SPLITS = ("train", "eval")
FINAL_ANSWER = "Done."

Cell = tuple[int, int]


def question(start: Cell, goal: Cell) -> str:
    return f"You are at {cell_text(start)}. Go to {cell_text(goal)}: {offset_text(start, goal)}."


def split_of(text: str) -> str:
    return "eval" if zlib.crc32(text.encode()) % EVAL_BUCKETS == 0 else "train"


def all_problems(split: str) -> list[tuple[Cell, Cell]]:
    """Every (start, goal) pair of `split`, in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    cells = [(x, y) for x in range(SIZE) for y in range(SIZE)]
    return [
        (s, g)
        for s in cells
        for g in cells
        if MIN_DISTANCE <= abs(s[0] - g[0]) + abs(s[1] - g[1]) <= MAX_DISTANCE and split_of(question(s, g)) == split
    ]


def sample_problems(n: int, seed: int, split: str) -> list[tuple[Cell, Cell]]:
    """`n` problems of `split`, deterministic in (seed, split): shuffled passes over all of the split's pairs."""
    pool = all_problems(split)
    rng = random.Random(f"grid/{seed}/{split}")
    out: list[tuple[Cell, Cell]] = []
    while len(out) < n:
        rng.shuffle(pool)
        out.extend(pool[: n - len(out)])
    return out


def make_grid_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`n` rows {"prompt": [user message], "start": "1,3", "goal": "3,2", "id": ...} of `split`."""
    rows = []
    for i, (start, goal) in enumerate(sample_problems(n, seed, split)):
        rows.append(
            {
                "prompt": [{"role": "user", "content": question(start, goal)}],
                "start": cell_text(start),
                "goal": cell_text(goal),
                "id": f"{split}-{i}-{cell_text(start)}-{cell_text(goal)}",
            }
        )
    return rows


def distance(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def random_walk(
    start: Cell, goal: Cell, rng: random.Random, toward: float = 0.0, observe: str = "offset"
) -> list[tuple[str, str]]:
    """(direction, observation) of each move of a random walk that stops at the goal or after MAX_MOVES; a move goes
    toward the goal with probability `toward`, else in a uniform direction."""
    cell, moves = start, []
    while len(moves) < MAX_MOVES and cell != goal:
        closer = [d for d in sorted(DIRECTIONS) if distance(step(cell, d)[0], goal) < distance(cell, goal)]
        direction = rng.choice(closer) if rng.random() < toward else rng.choice(sorted(DIRECTIONS))
        before = cell
        cell, blocked = step(cell, direction)
        moves.append((direction, observation(cell, blocked, goal, observe, before)))
    return moves


def warmup_messages(
    start: Cell, goal: Cell, rng: random.Random, toward: float = 0.0, observe: str = "offset"
) -> list[dict[str, Any]]:
    """A warm-up dialogue as chat messages: user question, then (move call, tool result) pairs, then "Done." when the
    walk reached the goal (a walk that gave up just ends)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question(start, goal)}]
    moves = random_walk(start, goal, rng, toward, observe)
    for direction, obs in moves:
        call = {"type": "function", "function": {"name": "move", "arguments": {"direction": direction}}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "move", "content": obs},
        ]
    cell = start
    for direction, _ in moves:
        cell = step(cell, direction)[0]
    if cell == goal:  # the walk stopped on the goal (a delayed observation does not say so yet)
        messages.append({"role": "assistant", "content": FINAL_ANSWER})
    return messages
