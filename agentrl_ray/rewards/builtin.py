"""Built-in reward functions, in TRL's signature: `fn(completions, **kwargs) -> list[float]`.

`completions` holds one completion per sample in the form TRL's tool loop builds (see `agentrl_ray.messages`):
assistant messages whose tool calls are structured `tool_calls`, then one `{"role": "tool", "content": ...}`
message per call. Older forms still work: a plain string is a single assistant message, and an assistant message
whose content holds raw `<tool_call>` blocks is parsed. kwargs carry the dataset columns (one value per sample),
`episode_stats` (one dict of counters per sample: finish_reason, num_tool_calls, num_tool_errors, num_steps,
num_step_errors, num_tokens), `env_rewards`, and what TRL passes too: `prompts`, `completion_ids`, `trainer_state`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl_ray.chat_format import extract_final_answer, numbers_match, parse_tool_calls

Completion = list[dict[str, Any]] | str


def messages_of(completion: Completion) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion


def final_answer_text(completion: Completion) -> str | None:
    """The last assistant message, if it is a final answer (no tool calls in it); else None."""
    assistant = [m for m in messages_of(completion) if m["role"] == "assistant"]
    if not assistant or assistant[-1].get("tool_calls"):
        return None
    parsed = parse_tool_calls(assistant[-1]["content"] or "")
    # A last turn that still asks for a tool was cut off (turn or token limit): it answers nothing.
    if parsed.calls or parsed.errors:
        return None
    return parsed.content


def answer_match(completions: list[Completion], answer: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the last number of the final answer equals the `answer` column (relative tolerance 1e-6), else 0.0."""
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        text = final_answer_text(completion)
        out.append(float(numbers_match(extract_final_answer(text) if text else None, expected)))
    return out


def count_tool_calls(completion: Completion, stats: dict | None = None) -> tuple[int, int]:
    """(tool calls, failed tool calls) of one sample: from the rollout's counters when given, else its messages.

    From messages, a call is an entry of `tool_calls` or a `<tool_call>` block in the content (well-formed or not),
    and a failure is a tool message starting with "Error:" (the env host's spelling of a failed call) or holding
    TRL's `{'error': ...}`.
    """
    if stats is not None:
        return stats["num_tool_calls"], stats["num_tool_errors"]
    messages = messages_of(completion)
    calls = 0
    for m in messages:
        if m["role"] == "assistant":
            parsed = parse_tool_calls(m["content"] or "")
            structured = len(m.get("tool_calls") or [])
            # Structured calls were taken out of the content, unless the turn also held a malformed one (then the
            # raw text stays): count its parse errors, never its well-formed blocks twice.
            calls += structured + len(parsed.errors) if structured else len(parsed.calls) + len(parsed.errors)
    errors = sum(1 for m in messages if m["role"] == "tool" and _is_error(m["content"]))
    return calls, errors


def _is_error(content: Any) -> bool:
    text = str(content)
    return text.startswith("Error:") or text.startswith("{'error':")


def _per_sample(kwargs: dict[str, Any], key: str, n: int) -> list[Any]:
    values = kwargs.get(key)
    return list(values) if values is not None else [None] * n


def tool_success(completions: list[Completion], episode_stats: list[dict] | None = None, **kwargs: Any) -> list:
    """Fraction of the sample's tool calls that succeeded; None (does not apply) for a sample without tool calls."""
    trajs = episode_stats if episode_stats is not None else [None] * len(completions)
    out: list[float | None] = []
    for completion, traj in zip(completions, trajs, strict=True):
        calls, errors = count_tool_calls(completion, traj)
        out.append((calls - errors) / calls if calls else None)
    return out


def efficiency_reward(token_budget: int = 1024, tool_call_budget: int = 4) -> Callable[..., list[float]]:
    """A reward in [0, 1]: 1 minus half the used share of `token_budget` minus half that of `tool_call_budget`.

    It rewards brevity whatever the outcome, so give it a small weight next to a correctness reward: GRPO compares
    samples within a group, where it then breaks ties between equally correct answers.
    """
    if token_budget <= 0 or tool_call_budget <= 0:
        raise ValueError(f"budgets must be positive, got {token_budget} tokens and {tool_call_budget} tool calls")

    def efficiency(completions: list[Completion], **kwargs: Any) -> list[float]:
        n = len(completions)
        trajs = _per_sample(kwargs, "episode_stats", n)
        ids = _per_sample(kwargs, "completion_ids", n)  # TRL passes token ids; our rollouts pass episode_stats
        out = []
        for completion, traj, token_ids in zip(completions, trajs, ids, strict=True):
            if traj is not None:
                tokens = traj["num_tokens"]
            elif token_ids is not None:
                tokens = len(token_ids)
            else:
                raise ValueError("efficiency needs token counts: pass `episode_stats` or `completion_ids`")
            calls, _ = count_tool_calls(completion, traj)
            out.append(1.0 - 0.5 * min(1.0, tokens / token_budget) - 0.5 * min(1.0, calls / tool_call_budget))
        return out

    return efficiency


efficiency = efficiency_reward()


def env_reward(completions: list[Completion], env_rewards: list[float | None], **kwargs: Any) -> list:
    """Task completion as judged by the environment itself (its `reward`/`get_reward`); None where it has none."""
    if len(env_rewards) != len(completions):
        raise ValueError(f"{len(env_rewards)} env rewards for {len(completions)} completions")
    return list(env_rewards)
