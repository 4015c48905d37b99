"""Self-play: two episodes of one group play one game of two players (an environment class with `players = 2`,
`envs.base`), both seats the policy, each seat's turns a trajectory of its own with its own reward.

- **Pairing.** Fixed by position, so a batch run stays reproducible: samples 2i and 2i+1 of a group play game i,
  seat 0 (the first to move) the even one (`rollout.group_size` and `run.eval_samples` must be even). A game is
  its row's: its one environment instance is created under seat 0's trajectory key and reset with the row (so with
  the row's seed); seat 1 has no instance of its own.
- **Each seat its own sequence.** A seat sees only what the game addresses to it. Seat 0's prompt is the row's with
  the game's first observation appended (as reset text is); seat 1 has no prompt until the game first asks it to
  move, and then the row's with its own first observation. Every later observation of a seat is a user turn of its
  own sequence, token for token as the template renders it; the opponent's moves reach it only as the game tells
  them.
- **Turns.** Only the seat the game waits for generates. The batch loop (`agent_loop.run_episodes`) leaves a
  waiting seat out of its turn's engine call without counting it done, so each engine call holds one seat of each
  game and the seats alternate; the stream loop plays a game as one task that generates its seats' turns in
  order. `rollout.max_turns` bounds each seat's turns.
- **The end, and each seat's reward** (its trajectory's environment reward, `env_reward`):
  - the game's outcome (a win, a loss, a draw; a loss by invalid moves, as the game rules): the game's rewards,
    both seats "done";
  - the seat to move cannot (its turn cut by the token budget: "length"; its turns used up: "max_turns"): it
    forfeits, `step(None)`, and the game scores it; the other seat is "done";
  - a move whose `step` fails (raises, passes `env.tool_timeout_s`, its env child dies): the game's state is
    unknown, both seats "error", no reward (None: the `env_reward` function scores 0 and counts `env_reward/none`);
  - a killed env host or rollout worker fails the whole rollout call, which the rollout pool redoes
    (`rollout/recovery.py`): a game's calls all go to its one key's host, so both seats are redone together.
  A seat that never moved (the game ended first) keeps the row's prompt alone, without a completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SEATS = 2


@dataclass(eq=False)  # by identity: its seats point back at it
class Game:
    key: str  # the game's environment: seat 0's trajectory key
    seats: list[Any]  # the seats' `agent_loop.Episode`s, seat 0 first
    to_move: int = 0
    over: bool = False
    rewards: list[float] | None = None  # each seat's, once the game has an outcome

    @classmethod
    def pair(cls, first: Any, second: Any) -> Game:
        game = cls(first.key, [first, second])
        for seat, ep in enumerate(game.seats):
            ep.game, ep.seat = game, seat
        return game

    @property
    def mover(self) -> Any:
        """The episode whose move the game waits for; None once it is over."""
        return None if self.over else self.seats[self.to_move]

    def forfeit_due(self) -> bool:
        """The seat to move can no longer move (its episode ended): it forfeits."""
        return not self.over and self.seats[self.to_move].done

    def end(self, reason: str, rewards: list[float] | None = None) -> None:
        """The game is over: every seat not yet done ends with `reason`."""
        self.over, self.rewards = True, rewards
        for ep in self.seats:
            if ep.render is not None:  # it never moved: its prompt is the row's alone
                ep.begin(None)
            if not ep.done:
                ep.finish_reason = reason

    def reward(self, seat: int) -> float | None:
        return None if self.rewards is None else self.rewards[seat]


def pair_group(episodes: list[Any]) -> list[Game]:
    """Samples 2i and 2i+1 of `episodes` (one group's, or several whole groups of even size, in order) play game i."""
    if len(episodes) % SEATS:
        raise ValueError(f"self-play pairs the samples of a group: {len(episodes)} is odd")
    return [Game.pair(episodes[i], episodes[i + 1]) for i in range(0, len(episodes), SEATS)]
