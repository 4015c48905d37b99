"""GridEnv: walk to a goal cell on a 5 x 5 grid with a `move(direction)` tool.

Every observation follows from the history: `move` answers "at X,Y" (the new cell), "blocked, at X,Y" when the move
would leave the grid (the agent stays), and appends " goal" once the cell is the goal the prompt names. A model
that predicts these observations (the ECHO loss) has learned what each direction does to the coordinates, which is
exactly what the policy needs to choose the move that brings it closer. The reward is the environment's own: 1.0 when
the episode ends on the goal cell, else 0.0.
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.tasks.grid import DIRECTIONS, observation, parse_cell, step


class GridEnv:
    """One walker per trajectory; the row's `start` and `goal` columns ("x,y") place it."""

    def reset(self, **row: Any) -> None:
        if "start" not in row or "goal" not in row:
            raise ValueError(f"GridEnv needs 'start' and 'goal' columns in each row, got {sorted(row)}")
        self.cell = parse_cell(row["start"], "start")
        self.goal = parse_cell(row["goal"], "goal")
        return None

    def move(self, direction: str) -> str:
        """Move one cell and return where you are.

        Args:
            direction: One of north, south, east, west.
        """
        if direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}: use north, south, east or west")
        self.cell, blocked = step(self.cell, direction)
        return observation(self.cell, blocked, self.goal)

    def reward(self, completion: str) -> float:
        return 1.0 if self.cell == self.goal else 0.0
