"""How long each wait on a remote call may take, derived from the config (no Ray here: unit-tested alone).

A deadline is an upper bound on healthy work, not an estimate: one that passes means the actor is stuck (stopped,
deadlocked, or waiting on one that is), and the rollout pool then kills and restarts it (`rollout/recovery.py`).
Generation is bounded per decode step of an engine's whole batch (`recovery.decode_step_s`): a turn is at most
`max_tokens_per_turn` steps per wave of `max_num_seqs` sequences; environment work by `env.tool_timeout_s`, which
the env host enforces per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentrl_ray.config import Config


@dataclass(frozen=True)
class Deadlines:
    """Seconds; one instance per run (`Deadlines.of(cfg)`), carried by the rollout pool."""

    turn_s: float
    """One turn of one engine: its generation for a full batch wave and the tool calls it leads to."""
    fixed_s: float
    """Per rollout call, besides its turns: reset, rewards, close (one tool timeout each) and the slack."""
    max_turns: int
    max_num_seqs: int
    probe_s: float
    """A healthy actor answers a ping within this: an engine's event loop is busy for at most one generate call."""
    actor_start_s: float
    """A restarted actor is back within this (an engine loads its model again)."""
    agent_s: float = 0.0
    """`env.agent`: one agent program's deadline (`env.agent_timeout_s`); 0 without an agent."""
    agent_processes: int = 1

    @classmethod
    def of(cls, cfg: Config, players: int = 1) -> Deadlines:
        """`players` 2: a game by self-play (rollout/selfplay.py), whose seats take their `max_turns` turns one
        after the other, and whose seat that cannot move forfeits by one more environment call."""
        r, rc = cfg.rollout, cfg.recovery
        generate = r.max_tokens_per_turn * rc.decode_step_s
        return cls(
            turn_s=generate + players * cfg.env.tool_timeout_s,
            fixed_s=3 * cfg.env.tool_timeout_s + rc.slack_s,
            max_turns=players * r.max_turns,
            max_num_seqs=r.max_num_seqs,
            probe_s=generate + rc.slack_s,
            actor_start_s=rc.actor_start_s,
            agent_s=cfg.env.agent_timeout_s if cfg.env.agent else 0.0,
            agent_processes=cfg.env.agent_processes,
        )

    def rollout_s(self, num_sequences: int) -> float:
        """One rollout call of `num_sequences` trajectories on one engine (sequences past `max_num_seqs` wait for
        a later wave)."""
        waves = max(1, math.ceil(num_sequences / self.max_num_seqs))
        # Agent programs run `agent_processes` at a time, each killed at its own deadline.
        agents = math.ceil(num_sequences / self.agent_processes) * self.agent_s
        return self.max_turns * waves * self.turn_s + agents + self.fixed_s
