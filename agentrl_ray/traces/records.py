"""Trace records: one JSON line per trajectory, as OpenAI-style chat messages.

A run with `run.save_rollouts=N` writes the rollouts of every N-th step to `<run_dir>/rollouts/step_<step>.jsonl`
(`run.outputs.write_rollouts`), and of every other step the first `run.rollout_sample_groups` groups (default 1):

    {"prompt_id": "17", "sample_index": 3, "step": 12, "policy_version": 11, "turn_versions": [11, 11], "reward": 1.0,
     "reward_parts": {"answer_match": 1.0}, "finish_reason": "answer", "num_tool_calls": 1, "num_tool_errors": 0,
     "prompt": [{"role": "user", "content": "What is 347 * 29?"}],
     "completion": [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_0_0", "type": "function",
                     "function": {"name": "calculator", "arguments": "{\\"expression\\": \\"347 * 29\\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_0_0", "name": "calculator", "content": "10063"},
                    {"role": "assistant", "content": "The answer is 10063."}],
     "tools": [...JSON schemas...], "columns": {"answer": "10063"}}

Agent logs from elsewhere are read too: a line needs `messages` (or `prompt` + `completion`) in OpenAI form and
`reward` (or a boolean `success`/`label`); `tools`, `prompt_id` and other columns are optional. A `messages` list is
split into prompt and completion at its first assistant message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl_ray.data import row_tools
from agentrl_ray.messages import from_openai, to_openai

if TYPE_CHECKING:  # types imports torch; reading and converting traces does not need it
    from agentrl_ray.types import TrajectoryGroup

_SKIP_COLUMNS = ("prompt", "id")  # a row's columns that the record already holds elsewhere


@dataclass
class TraceRecord:
    """One trajectory of a trace file, its messages in TRL form (dict arguments)."""

    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    reward: float
    prompt_id: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""
    num_tool_errors: int = 0


def group_records(
    groups: list[TrajectoryGroup],
    step: int,
    rows_by_id: dict[str, dict[str, Any]],
    tools: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """JSON-ready records of a step's groups (`rows_by_id`: the dataset rows, for the columns rewards read).
    `turn_versions`: the weights version of each assistant turn, in order ([] where not recorded): in the stream
    pipeline a weight update can land between two turns of one trajectory."""
    out = []
    for g in groups:
        row = rows_by_id.get(g.prompt_id, {})
        columns = {k: v for k, v in row.items() if k not in _SKIP_COLUMNS and k != "tools"}
        own_tools = row_tools(row, tools)  # a row's own tools (BFCL) were its prompt's
        for t in g.trajectories:
            out.append(
                {
                    "prompt_id": t.prompt_id,
                    "sample_index": t.sample_index,
                    "step": step,
                    "policy_version": t.policy_version,
                    "turn_versions": turn_versions(t.token_versions),
                    "reward": t.reward,
                    "reward_parts": t.reward_parts,
                    "finish_reason": t.finish_reason,
                    "num_tool_calls": t.num_tool_calls,
                    "num_tool_errors": t.num_tool_errors,
                    "prompt": to_openai(t.prompt_messages),
                    "completion": to_openai(t.completion_messages),
                    "tools": own_tools,
                    "columns": columns,
                }
            )
    return out


def trace_files(source: str | Path) -> list[Path]:
    """A .jsonl file, or every .jsonl under a folder (a run dir or its rollouts/ folder), in name order."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(path.rglob("*.jsonl"))
        files = [f for f in files if f.name != "metrics.jsonl"]
        if files:
            return files
        raise ValueError(f"{path}: no .jsonl trace files in this folder")
    raise ValueError(f"{path}: no such trace file or folder")


def read_records(source: str | Path) -> list[TraceRecord]:
    """Every trace record under `source`; a malformed line fails naming its file and line."""
    records = []
    for path in trace_files(source):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                records.append(parse_record(line, f"{path}:{n}"))
    if not records:
        raise ValueError(f"{source}: the trace files hold no records")
    return records


def parse_record(line: str, where: str) -> TraceRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a trace record is a JSON object")
    if "prompt" in obj and "completion" in obj:
        prompt = from_openai(obj["prompt"], f"{where} prompt")
        completion = from_openai(obj["completion"], f"{where} completion")
    elif "messages" in obj:
        messages = from_openai(obj["messages"], f"{where} messages")
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None:
            raise ValueError(f"{where}: the messages hold no assistant message")
        prompt, completion = messages[:first], messages[first:]
    else:
        raise ValueError(f"{where}: a trace record needs 'messages' or 'prompt' + 'completion'")
    if not prompt:
        raise ValueError(f"{where}: the conversation has no prompt before its first assistant message")
    reward = obj.get("reward")
    if reward is None:
        label = obj.get("success", obj.get("label"))
        if not isinstance(label, bool):
            raise ValueError(f"{where}: a trace record needs a numeric 'reward' or a boolean 'success'/'label'")
        reward = float(label)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise ValueError(f"{where}: 'reward' must be a number, got {reward!r}")
    known = {"prompt", "completion", "messages", "reward", "success", "label", "tools", "prompt_id", "columns"}
    columns = dict(obj.get("columns") or {}) | {k: v for k, v in obj.items() if k not in known and k[:4] != "num_"}
    for k in ("sample_index", "step", "policy_version", "turn_versions", "reward_parts", "finish_reason"):
        columns.pop(k, None)
    return TraceRecord(
        prompt=prompt,
        completion=completion,
        reward=float(reward),
        prompt_id=str(obj.get("prompt_id") or json.dumps(prompt, sort_keys=True)),
        tools=list(obj.get("tools") or []),
        columns=columns,
        finish_reason=str(obj.get("finish_reason", "")),
        num_tool_errors=int(obj.get("num_tool_errors", 0)),
    )


def turn_versions(token_versions: list[int]) -> list[int]:
    """The version of each run of sampled tokens (each assistant turn) in a trajectory's per-token versions."""
    out, previous = [], -1
    for v in token_versions:
        if v >= 0 and v != previous:
            out.append(v)
        previous = v
    return out
