"""A trajectory's calls to training sequences.

Every sampled completion (each choice of each call) is trained once. In call order, a completion joins the
sequence whose ids its call's prompt extends token for token (the previous prompt plus completion, then the tool
results and user turns the agent appended): the appended ids keep the roles `calls.Renderer` gave them (environment
text for the ECHO loss, template in no loss) and the completion's ids are action tokens with their log-probs. A call
whose prompt extends no sequence (the agent summarised or dropped turns, changed its tools, or branched from an
earlier point) starts a new sequence whose whole prompt is prompt tokens: its earlier turns were trained where they
were sampled. One trajectory may so give several sequences; they share its reward and its advantage (the learner
expands `Trajectory.earlier_parts`, `learner/batching.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl_ray.rollout.continuity import Turn, continuity_break
from agentrl_ray.rollout.endpoint.calls import Call
from agentrl_ray.types import TokenRole


@dataclass
class Sequence:
    ids: list[int]
    roles: list[TokenRole]
    logprobs: list[float]
    prompt_len: int
    last_call: int  # index of the last call whose completion this sequence holds
    turns: list[Turn] = field(default_factory=list)  # the calls it holds, as the engine saw and answered them

    def continuity_break(self) -> str:
        """`rollout/continuity.py`'s check of this sequence against its calls."""
        return continuity_break(self.turns, self.ids, [int(r == TokenRole.ACTION) for r in self.roles], self.logprobs)


def stitch(calls: list[Call]) -> list[Sequence]:
    """The training sequences of one trajectory's calls, in the order they started."""
    sequences: list[Sequence] = []
    for call in calls:
        for choice in call.choices:
            seq = _extended(sequences, call.prompt_ids)
            if seq is None:
                n = len(call.prompt_ids)
                seq = Sequence(list(call.prompt_ids), [TokenRole.PROMPT] * n, [0.0] * n, n, call.index)
                sequences.append(seq)
            else:
                k = len(seq.ids)
                seq.ids += call.prompt_ids[k:]
                seq.roles += call.prompt_roles[k:]
                seq.logprobs += call.prompt_logprobs[k:]
            seq.turns.append(Turn(call.prompt_ids, choice.token_ids, choice.logprobs))
            seq.ids += choice.token_ids
            seq.roles += [TokenRole.ACTION] * len(choice.token_ids)
            seq.logprobs += choice.logprobs
            seq.last_call = call.index
    return sequences


def _extended(sequences: list[Sequence], prompt: list[int]) -> Sequence | None:
    """The latest sequence that `prompt` extends token for token (a strict prefix of it)."""
    for seq in reversed(sequences):
        if len(seq.ids) < len(prompt) and prompt[: len(seq.ids)] == seq.ids:
            return seq
    return None
