"""GridEnv: walk to a goal cell on a 5 x 5 grid with a `move(direction)` tool.

Every observation follows from the history: `move` answers with the new cell and where the goal now lies ("at 2,3,
goal 1 east 1 south"), "blocked, ..." when the move would leave the grid (the agent stays), and "at X,Y goal" on the
goal cell (`observations="cell"`: the cell only, "at 2,3"; "delayed": one move late, "moved, before: at 1,3, goal
2 east 1 south", so the policy must predict where its last move took it: `tasks.grid`'s docstring). A model
that predicts these observations (the ECHO loss) has learned what each direction does to the cell and to the offset,
the knowledge the policy needs to choose the move that brings it closer. The reward is the
environment's own: 1.0 when the episode ends on the goal cell, else `progress_credit` times the share of the start's
distance walked off (0 by default; `examples/grid` uses 0.5). Success (`run.success_threshold` 1.0) still means the
goal only: the credit just lets GRPO tell a walk that got closer from one that wandered off, when no walk of a group
reached the goal.
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.tasks.grid import DIRECTIONS, check_observe, distance, observation, parse_cell, step


class GridEnv:
    """One walker per trajectory; the row's `start` and `goal` columns ("x,y") place it. `observations` "cell" leaves
    the goal's offset out of the observations (`tasks.grid`'s docstring)."""

    def __init__(self, progress_credit: float = 0.0, observations: str = "offset") -> None:
        if not 0.0 <= progress_credit < 1.0:
            raise ValueError(f"env.kwargs.progress_credit must be in [0, 1) (below the goal's 1.0): {progress_credit}")
        self.progress_credit = progress_credit
        self.observe = check_observe(observations)

    def reset(self, **row: Any) -> None:
        if "start" not in row or "goal" not in row:
            raise ValueError(f"GridEnv needs 'start' and 'goal' columns in each row, got {sorted(row)}")
        self.cell = parse_cell(row["start"], "start")
        self.goal = parse_cell(row["goal"], "goal")
        self.start = self.cell
        return None

    def move(self, direction: str) -> str:
        """Move one cell and return where you are.

        Args:
            direction: One of north, south, east, west.
        """
        if direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}: use north, south, east or west")
        before = self.cell
        self.cell, blocked = step(self.cell, direction)
        return observation(self.cell, blocked, self.goal, self.observe, before)

    def reward(self, completion: str) -> float:
        if self.cell == self.goal:
            return 1.0
        walked_off = distance(self.start, self.goal) - distance(self.cell, self.goal)
        return self.progress_credit * max(0, walked_off) / max(1, distance(self.start, self.goal))
