"""GEM environments (`gem-llm`, "A Gym for Generalist LLMs"), unchanged, as turn-based environments of ours
(`envs.base`).

    env:
      name: agentrl_ray.envs.adapters.gem:GEMEnv
      kwargs: {id: "game:GuessTheNumber-v0-easy"}          # any id of gem's registry: game:, rg:, ...
      # kwargs: {id: "rg:basic_arithmetic", tools: [python], max_tool_uses: 3}   # its ToolEnvWrapper around it

A GEM environment is made per trajectory with `gem.make(id, **env_kwargs)` (inside `ToolEnvWrapper` when `tools` are
named: `python` is gem's PythonCodeTool, which runs the code of a `<python>...</python>` block in a subprocess with
gem's timeout) and reset with the row's `seed` (else a seed from its `id`), so one row is one game, the same every
time. Then, with GEM's gym-like contract:

- `reset(seed) -> (observation, info)`: the first observation (the game's rules, the question, the tools'
  instructions) is appended to the row's prompt.
- `step(text) -> (observation, reward, terminated, truncated, info)`: the assistant's whole turn is the action; the
  observation, followed by the `info["suffix"]` GEM's own observation wrapper appends ("Enter your next guess."), is
  the next user turn, environment tokens (ECHO's target). A step's reward is the step's; the episode's reward is the
  sum of its steps' (GEM's turn-level rewards added up). `terminated` or `truncated` ends the episode; GEM's
  terminal observation is not shown.

We keep the conversation ourselves (token-in/token-out), so none of GEM's observation wrappers, which re-render the
whole history into each observation, is used. GEM's math, code and QA sets download datasets at `make`: they need a
machine with Hugging Face access. A missing package is one line naming what to install. Everything runs at
`env.isolation` like any environment of ours: a GEM environment that raises, hangs or crashes costs its trajectory.
"""

from __future__ import annotations

import zlib
from typing import Any

INSTALL = "pip install --no-deps gem-llm==0.1.0 (it pins reasoning-gym==0.1.23; ours is 0.1.25: make install does this)"
TOOLS = ("python",)


class GEMEnv:
    def __init__(
        self,
        id: str,  # noqa: A002 - GEM's word
        env_kwargs: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        max_tool_uses: int = 10,
        tool_timeout: int = 5,
    ) -> None:
        try:
            import gem
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"GEMEnv needs the gem-llm package: {INSTALL}") from None
        from gem.envs.registration import ENV_REGISTRY

        if id not in ENV_REGISTRY:
            raise ValueError(f"GEMEnv: {id!r} is not a registered GEM environment (e.g. {sorted(ENV_REGISTRY)[:8]})")
        unknown = sorted(set(tools or ()) - set(TOOLS))
        if unknown:
            raise ValueError(f"GEMEnv: unknown tools {unknown}; GEM's tools here: {list(TOOLS)}")
        self._gem = gem
        self.id = id
        self.env_kwargs = dict(env_kwargs or {})
        self.tools = list(tools or ())
        self.max_tool_uses = max_tool_uses
        self.tool_timeout = tool_timeout
        self.env: Any = None

    def _make(self) -> Any:
        env = self._gem.make(self.id, **self.env_kwargs)
        if not self.tools:
            return env
        from gem.tools.python_code_tool import PythonCodeTool
        from gem.tools.tool_env_wrapper import ToolEnvWrapper

        return ToolEnvWrapper(env, [PythonCodeTool(timeout=self.tool_timeout)], max_tool_uses=self.max_tool_uses)

    def reset(self, **row: Any) -> str | None:
        seed = row.get("seed")
        if seed is None:
            seed = zlib.crc32(str(row.get("id", "")).encode())
        self.close()
        self.env = self._make()
        observation, info = self.env.reset(seed=int(seed))
        return _text(observation, info) or None

    def step(self, text: str) -> tuple[str | None, float, bool]:
        if self.env is None:
            raise RuntimeError("step before reset")
        observation, reward, terminated, truncated, info = self.env.step(text)
        if terminated or truncated:
            return None, float(reward), True
        return _text(observation, info), float(reward), False

    def close(self) -> None:
        self.env = None


def _text(observation: Any, info: dict[str, Any]) -> str:
    """An observation as GEM's own wrapper shows it: its text, a line break, then the info's suffix if any."""
    text = str(observation or "")
    suffix = str((info or {}).get("suffix") or "")
    if suffix:
        text = (text if not text or text.endswith("\n") else text + "\n") + suffix
    return text
