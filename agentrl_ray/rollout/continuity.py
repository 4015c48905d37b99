"""Token continuity: the learner trains on exactly the ids the engine conditioned on and sampled.

Every engine call of a trajectory is recorded as a `Turn`: the prompt ids the engine was given and the ids it
sampled with their log-probs. Where the trajectory is assembled (the agent loop's `Episode` into a `Trajectory`,
the endpoint's calls into stitched sequences), `continuity_break` checks that each turn's prompt is a prefix of the
trained sequence, the sampled ids follow it as action tokens with the engine's log-probs, and each turn's prompt
extends the previous turn's prompt and sample. So turn k+1's prompt = turn k's prompt + its sample + the
environment's tokens, token for token: a separator dropped between turns, a turn re-tokenized from its text, or
log-probs shifted by one all show here, with the turn and the token where the sequences part.

The check is a few list comparisons per turn (C-speed slices): measured with the other integrity checks in
`benchmarks/run.py overhead --mode integrity_cost`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Turn:
    """One engine call of a trajectory, as the engine saw and answered it."""

    prompt: list[int]
    sampled: list[int]
    logprobs: list[float]
    version: int = -1  # the weights version that sampled it (-1: not recorded)


def token_versions(turns: list[Turn], length: int) -> list[int]:
    """The policy version of each of a sequence's `length` tokens: a sampled token's turn's version, -1 for the
    prompt's and the environment's tokens; [] when no turn recorded its version."""
    if not turns or any(turn.version < 0 for turn in turns):
        return []
    versions = [-1] * length
    for turn in turns:
        n = len(turn.prompt)
        versions[n : n + len(turn.sampled)] = [turn.version] * len(turn.sampled)
    return versions[:length]


def continuity_break(turns: list[Turn], ids: list[int], action_mask: list[int], logprobs: list[float]) -> str:
    """ "" when the trained sequence (`ids`, its action mask and rollout log-probs) holds every turn intact, else
    one line saying where it first does not."""
    end = 0  # where the previous turn's sample ended
    for k, turn in enumerate(turns, start=1):
        n, m = len(turn.prompt), len(turn.sampled)
        if n < end:
            return (
                f"turn {k}: the engine's prompt ({n} tokens) is shorter than turn {k - 1}'s prompt and sample "
                f"({end} tokens): the conversation was rewritten between turns"
            )
        at = _first_difference(turn.prompt, ids)
        if at is not None:
            return f"turn {k}: {_token_at(ids, at)} of the trained sequence, the engine's prompt had {turn.prompt[at]}"
        at = _first_difference(turn.sampled, ids[n : n + m])
        if at is not None:
            return f"turn {k}: {_token_at(ids, n + at)} of the trained sequence, the engine sampled {turn.sampled[at]}"
        if not all(action_mask[n : n + m]):
            i = n + action_mask[n : n + m].index(0)
            return f"turn {k}: token {i}, which the engine sampled, is not an action token of the trained sequence"
        if logprobs[n : n + m] != turn.logprobs:
            i = n + next(j for j, (a, b) in enumerate(zip(logprobs[n : n + m], turn.logprobs)) if a != b)
            return f"turn {k}: the log-prob of token {i} is {logprobs[i]:.6g}, the engine's {turn.logprobs[i - n]:.6g}"
        end = n + m
    return ""


def _first_difference(expected: list[int], ids: list[int]) -> int | None:
    """The first position of `expected` that `ids` does not hold (past its end counts), or None."""
    if ids[: len(expected)] == expected:
        return None
    return next((i for i, (a, b) in enumerate(zip(expected, ids)) if a != b), min(len(expected), len(ids)))


def _token_at(ids: list[int], i: int) -> str:
    return f"token {i} is {ids[i]}" if i < len(ids) else f"token {i} is missing (the sequence ends at {len(ids)})"
