"""BFCLMultiTurnEnv: one BFCL v4 multi-turn task (a user who asks again after each answer, stateful tools), as a
turn-based environment (`step`, `agentrl_ray.envs.base`) that runs the model's calls itself.

The functions the model may call are the row's (its `tools` column, rendered in the prompt by the rollout). Each
assistant turn goes to `step(text)`:
- with calls (`<tool_call>` blocks): they run, in order, on the task's instances of BFCL's own tool classes (a file
  system, MathAPI, trading, travel, ...), and their results come back as tool messages: environment tokens, what
  ECHO trains on. A call that cannot be parsed is answered with its parse error.
- without a call: the model has answered the user's turn. The judge (`agentrl_ray.tasks.bfcl.multi_turn.Judge`)
  replays the turn's ground truth and checks state and results by BFCL's rules. A failed turn ends the task; a
  passed one brings the user's next turn, until the last.

Reward (the sum of the steps' rewards): `reward="task"` (default) is BFCL's verdict, 1.0 when every turn passed,
else 0.0; `reward="turns"` gives the fraction of turns passed, a denser signal for RL, kept when the episode's token
or turn budget ends it early. Rows come from `python examples/bfcl/make_data.py
--multi-turn` (`agentrl_ray.tasks.bfcl.multi_turn.rows`); the environment finds the task's turns, state and
ground truth by the row's `id` in the installed bfcl-eval.
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.chat_format import parse_tool_calls
from agentrl_ray.tasks.bfcl.multi_turn import Judge, TurnVerdict, task_by_id

REWARDS = ("task", "turns")


class BFCLMultiTurnEnv:
    """After the episode, `verdicts` holds each judged turn's verdict (valid, and why not)."""

    def __init__(self, reward: str = "task") -> None:
        if reward not in REWARDS:
            raise ValueError(f"BFCLMultiTurnEnv reward must be one of {REWARDS}, got {reward!r}")
        self.reward_mode = reward
        self.judge: Judge | None = None
        self.verdicts: list[TurnVerdict] = []

    def reset(self, **row: Any) -> None:
        if "id" not in row:
            raise ValueError("BFCLMultiTurnEnv: the row has no 'id' column (rows of make_data.py --multi-turn have)")
        self.judge, self.verdicts = Judge(task_by_id(str(row["id"]))), []
        return None

    def step(self, text: str) -> tuple[list[dict[str, str]] | None, float, bool]:
        judge = self.judge
        if judge is None:
            raise RuntimeError("step before reset")
        parsed = parse_tool_calls(text)
        if parsed.calls or parsed.errors:
            results = [judge.model_call(c.name, c.arguments) for c in parsed.calls]
            results += [f"Error: could not parse tool call: {e}" for e in parsed.errors]
            return [{"role": "tool", "content": r} for r in results], 0.0, False
        verdict = judge.end_turn()
        self.verdicts.append(verdict)
        reward = self._reward(verdict, judge)
        if not verdict.valid or judge.done:
            return None, reward, True
        return [{"role": "user", "content": judge.task.turns[judge.turn]}], reward, False

    def _reward(self, verdict: TurnVerdict, judge: Judge) -> float:
        """This step's part of the reward (the episode's is the sum of its steps'): under "turns" each passed turn
        adds 1/turns, so an episode cut short keeps what it earned; under "task" only the last turn's pass pays."""
        if not verdict.valid:
            return 0.0
        if self.reward_mode == "turns":
            return 1.0 / len(judge.task.turns)
        return 1.0 if judge.done else 0.0
