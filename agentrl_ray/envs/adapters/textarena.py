"""TextArena's games (`textarena`), unchanged, as turn-based environments of ours (`envs.base`): its single-player
games, and its two-player games by self-play (both players the policy, each player's turns its own trajectory).

    env:
      name: agentrl_ray.envs.adapters.textarena:TextArenaEnv       # single-player; TextArenaSelfPlay for two
      kwargs: {id: GuessTheNumber-v0}      # any registered game; `game_kwargs` go to its constructor

A game is made per trajectory (per pair of trajectories in self-play) from its raw registration (`<id>-raw`: none of
the wrappers that re-send the whole history each turn, which would break token-in/token-out) and reset with the
row's `seed` (else a seed from its `id`), so one row is one game, the same one every time. Then:

- `reset` returns the game's first observation (its rules and board), appended to the row's prompt.
- `step(text)` plays the assistant's whole turn as the player's action; the messages the game sends back (the
  moves it accepted or refused, the next board) are the next user turn, environment tokens (ECHO's target). The
  player's own action, which TextArena echoes into its observation, is left out: it is already the sampled turn.
- When the game ends, the episode's reward is the player's reward from `close()` (TextArena's: 1 for a win, 0 or
  -1 for a loss or an invalid move, as the game defines it), and every earlier turn's 0.

`TextArenaSelfPlay` (`players = 2`, the game contract of `envs.base`; the loop's side: `rollout/selfplay.py`) plays
a two-player game: seat 0 is the player TextArena lets move first. Each seat's observations are the messages
TextArena addresses to its player since that player's last move (the opponent's move and the board among them), so
each trajectory holds only its own player's view. The rewards are TextArena's (1 win, -1 loss, 0 draw; a second
invalid move in a row loses, as TextArena rules, with one retry after the first). A forfeit (`step(None)`: the seat
to move ran out of tokens or turns) scores as TextArena's losing invalid move: -1, the opponent 1. Games of more
than two players are refused.
"""

from __future__ import annotations

import zlib
from typing import Any

INSTALL = "pip install 'agentrl_ray[envs]' (textarena==0.7.4)"
SELF_PLAY = "agentrl_ray.envs.adapters.textarena:TextArenaSelfPlay"


class TextArenaEnv:
    players = 1

    def __init__(self, id: str, game_kwargs: dict[str, Any] | None = None) -> None:  # noqa: A002 - TextArena's word
        try:
            import textarena
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"TextArenaEnv needs the textarena package: {INSTALL}") from None
        from textarena.envs.registration import ENV_REGISTRY

        raw = id if id.endswith("-raw") else f"{id}-raw"
        if raw not in ENV_REGISTRY:
            games = sorted(k for k in ENV_REGISTRY if k.endswith("-v0"))
            raise ValueError(f"TextArenaEnv: {id!r} is not a registered TextArena game (e.g. {games[:8]})")
        self._make = lambda: textarena.make(env_id=raw, **(game_kwargs or {}))
        self.id = id
        self.env: Any = None
        self.player = 0

    def reset(self, **row: Any) -> str | None:
        self._start(row)
        self.player, first = self.env.get_observation()
        return _text(first, self.player)

    def _start(self, row: dict[str, Any]) -> None:
        seed = row.get("seed")
        if seed is None:
            seed = zlib.crc32(str(row.get("id", "")).encode())
        self.env = self._make()
        try:
            self.env.reset(num_players=self.players, seed=int(seed))
        except Exception as e:
            if "player" not in str(e).lower():
                raise
            if self.players == 1:
                raise ValueError(f"TextArenaEnv: {self.id} is not a single-player game: play it by self-play with "
                                 f"env.name={SELF_PLAY}") from e  # fmt: skip
            raise ValueError(f"TextArenaSelfPlay: {self.id} is not a two-player game ({e})") from e

    def step(self, text: str) -> tuple[str | None, float, bool]:
        if self.env is None:
            raise RuntimeError("step before reset")
        done, _info = self.env.step(text)
        if done:
            rewards, _game_info = self.env.close()
            return None, float((rewards or {}).get(self.player, 0.0)), True
        self.player, messages = self.env.get_observation()
        return _text(messages, self.player), 0.0, False

    def close(self) -> None:
        self.env = None


class TextArenaSelfPlay(TextArenaEnv):
    """A two-player game, both seats the policy: one instance per game (`envs.base`, `players = 2`)."""

    players = 2

    def reset(self, **row: Any) -> str | None:
        self._start(row)
        self.first, observation = self.env.get_observation()  # seat 0 is whoever TextArena lets move first
        return _text(observation, self.first)

    def step(self, text: str | None) -> tuple[int | None, str | None, list[float] | None]:  # type: ignore[override]
        if self.env is None:
            raise RuntimeError("step before reset")
        if text is None:  # a forfeit, scored as TextArena scores a losing invalid move
            mover = self._seat(self.env.state.current_player_id)
            return None, None, [-1.0 if seat == mover else 1.0 for seat in range(2)]
        done, _info = self.env.step(text)
        if done:
            rewards, _game_info = self.env.close()
            return None, None, [float((rewards or {}).get(self._player(seat), 0.0)) for seat in range(2)]
        player, messages = self.env.get_observation()
        return self._seat(player), _text(messages, player), None

    def _seat(self, player: int) -> int:
        return (player - self.first) % 2

    def _player(self, seat: int) -> int:
        return (seat + self.first) % 2


def _text(messages: list[Any], player: int) -> str:
    """A raw observation's messages, `(from_id, message, type)`, as one text, without the player's own action."""
    from textarena.core import ObservationType

    kept = [m for frm, m, kind in messages if not (frm == player and kind == ObservationType.PLAYER_ACTION)]
    return "\n".join(m.strip() for m in kept if m and m.strip())
