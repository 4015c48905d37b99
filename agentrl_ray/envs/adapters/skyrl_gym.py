"""SkyRL Gym environments (`skyrl-gym`), unchanged, as turn-based environments of ours (`envs.base`).

    env:
      name: agentrl_ray.envs.adapters.skyrl_gym:SkyRLGymEnv
      kwargs: {id: gsm8k_multi_turn}       # a registered id; without it, each row's `env_class` column names it

A SkyRL environment is made per trajectory with `skyrl_gym.make(id, env_config=..., extras=row)`: the row is what
SkyRL's datasets hold (`prompt`, `env_class`, `reward_spec: {method, ground_truth}`, `extra_info`), passed whole as
its `extras`, as SkyRL's generator does. Then:

- `init(prompt)` runs at `reset`. An environment that only appends to the last user message has it appended (our
  reset convention); one that rewrites the prompt otherwise is an error, since the rollout renders the row's prompt:
  give the rows the prompt it expects.
- `step(text)` gets the assistant's whole turn; its `observations` (OpenAI messages) become ours: `tool` messages
  as tool results, `user` ones joined into the next user turn, both environment tokens (ECHO's target). Its reward
  is the step's, and the episode's reward is the sum of its steps' (SkyRL's turn-level rewards added up). A
  `postprocessed_action` is ignored: the learner trains on the tokens that were sampled, never on rewritten text.
- `close()` is the environment's `close()`.

A missing package is one line naming what to install. Everything runs at `env.isolation` like any environment of
ours: a SkyRL environment that raises, hangs or crashes costs its own trajectory.
"""

from __future__ import annotations

from typing import Any

INSTALL = "pip install 'agentrl_ray[envs]' (skyrl-gym==0.4.0)"
ROLES = ("user", "tool")


class SkyRLGymEnv:
    def __init__(self, id: str = "", env_config: dict[str, Any] | None = None) -> None:  # noqa: A002 - SkyRL's word
        try:
            import skyrl_gym
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"SkyRLGymEnv needs the skyrl-gym package: {INSTALL}") from None
        self._gym = skyrl_gym
        self.id = id
        self.env_config = dict(env_config or {})
        self.env: Any = None

    def reset(self, **row: Any) -> str | None:
        env_id = self.id or row.get("env_class")
        if not env_id:
            raise ValueError("SkyRLGymEnv: no environment id: set env.kwargs.id, or give the rows an env_class column")
        registry = self._gym.registry
        if env_id not in registry:
            raise ValueError(f"SkyRLGymEnv: {env_id!r} is not a registered skyrl-gym environment: {sorted(registry)}")
        self.close()
        self.env = self._gym.make(env_id, env_config=self.env_config, extras=row)
        prompt = _messages(row.get("prompt"))
        shown, _info = self.env.init([dict(m) for m in prompt])
        return _appended(prompt, _messages(shown), env_id)

    def step(self, text: str) -> tuple[list[dict[str, str]] | None, float, bool]:
        if self.env is None:
            raise RuntimeError("step before reset")
        out = self.env.step(text)
        observation = _observation(out.get("observations") or [])
        return observation, float(out.get("reward") or 0.0), bool(out.get("done"))

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            env.close()


def _messages(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        raise ValueError(f"SkyRLGymEnv: a prompt must be a string or chat messages, got {type(prompt).__name__}")
    return [{"role": str(m.get("role")), "content": str(m.get("content") or "")} for m in prompt]


def _appended(prompt: list[dict[str, str]], shown: list[dict[str, str]], env_id: str) -> str | None:
    """What `init` added to the prompt: nothing, or text appended to its last message; else an error."""
    if shown == prompt:
        return None
    same_head = len(shown) == len(prompt) and shown[:-1] == prompt[:-1] and shown[-1]["role"] == prompt[-1]["role"]
    if same_head and shown[-1]["content"].startswith(prompt[-1]["content"]):
        return shown[-1]["content"][len(prompt[-1]["content"]) :]
    raise ValueError(
        f"SkyRLGymEnv: {env_id}.init() rewrites the prompt (not only appending to its last message); the rollout "
        "renders the row's own prompt, so give the rows the prompt the environment expects"
    )


def _observation(messages: list) -> list[dict[str, str]] | None:
    """SkyRL's observation messages as ours: the tool results in order, then the user messages as one turn."""
    tools, users = [], []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise ValueError(f"SkyRLGymEnv: observation[{i}] has role {role!r}; only {ROLES} can follow a turn")
        (tools if role == "tool" else users).append(str(m.get("content") or ""))
    out = [{"role": "tool", "content": t} for t in tools]
    if users:
        out.append({"role": "user", "content": "\n\n".join(users)})
    return out or None
