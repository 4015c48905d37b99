"""TextArena's single-player games (`textarena`), unchanged, as turn-based environments of ours (`envs.base`).

    env:
      name: agentrl_ray.envs.adapters.textarena:TextArenaEnv
      kwargs: {id: GuessTheNumber-v0}      # any registered single-player game; `game_kwargs` go to its constructor

A game is made per trajectory from its raw registration (`<id>-raw`: none of the wrappers that re-send the whole
history each turn, which would break token-in/token-out) and reset with the row's `seed` (else a seed from its
`id`), so one row is one game, the same one every time. Then:

- `reset` returns the game's first observation (its rules and board), appended to the row's prompt.
- `step(text)` plays the assistant's whole turn as the player's action; the messages the game sends back (the
  moves it accepted or refused, the next board) are the next user turn, environment tokens (ECHO's target). The
  player's own action, which TextArena echoes into its observation, is left out: it is already the sampled turn.
- When the game ends, the episode's reward is the player's reward from `close()` (TextArena's: 1 for a win, 0 or
  -1 for a loss or an invalid move, as the game defines it), and every earlier turn's 0.

Games of two or more players need self-play (each player our policy, each player's turns its own sequence with its
own reward): not adapted yet, and refused with that reason.
"""

from __future__ import annotations

import zlib
from typing import Any

INSTALL = "pip install 'agentrl_ray[envs]' (textarena==0.7.4)"


class TextArenaEnv:
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
        seed = row.get("seed")
        if seed is None:
            seed = zlib.crc32(str(row.get("id", "")).encode())
        self.env = self._make()
        try:
            self.env.reset(num_players=1, seed=int(seed))
        except Exception as e:
            if "player" in str(e).lower():
                raise ValueError(
                    f"TextArenaEnv: {self.id} is not a single-player game: self-play is not adapted yet"
                ) from e
            raise
        self.player, first = self.env.get_observation()
        return _text(first, self.player)

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


def _text(messages: list[Any], player: int) -> str:
    """A raw observation's messages, `(from_id, message, type)`, as one text, without the player's own action."""
    from textarena.core import ObservationType

    kept = [m for frm, m, kind in messages if not (frm == player and kind == ObservationType.PLAYER_ACTION)]
    return "\n".join(m.strip() for m in kept if m and m.strip())
