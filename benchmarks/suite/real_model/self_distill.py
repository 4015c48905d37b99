"""A warm start from the model's own right answers (rejection-sampling fine-tuning): sample the untrained model on
BFCL's train split, read each answer leniently (a fenced JSON object, or a list of them, taken as calls, beside any
`<tool_call>` block), keep the answers BFCL's AST check accepts, and write them back as the calls they are, in the
chat format the RL run parses (`<tool_call>` blocks, through the model's own template at SFT time).

Why: Qwen2.5-Coder-0.5B-Instruct writes good calls as fenced ```json blocks, which the strict reader scores 0; an SFT
on the reference answers teaches the tags but also pulls the model off its own answers (docs/real_model.md: simple
0.772 lenient untrained, 0.594 strict after 128 reference rows). Trained on its own accepted answers, only the
format moves. Nothing of the held-out split is read: the samples come from the train split.

    python benchmarks/run.py real_model bfcl --warm-start self ...    (its phases: sample, distill, sft, rl)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FENCE = "```"


def fenced_blocks(text: str) -> list[str]:
    """The bodies of the ``` fenced blocks of `text`, a language word on the opening line dropped; an unclosed last
    block is left out. One pass over the text."""
    blocks, pos = [], 0
    while (start := text.find(FENCE, pos)) >= 0:
        body = text.find("\n", start)
        end = text.find(FENCE, start + len(FENCE)) if body < 0 else text.find(FENCE, body)
        if body < 0 or end < 0:
            break
        blocks.append(text[body + 1 : end])
        pos = end + len(FENCE)
    return blocks


def _as_call(obj: Any) -> tuple[str, dict] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return (obj["name"], args) if isinstance(args, dict) else None


def lenient_calls(text: str) -> list[tuple[str, dict]]:
    """The calls an answer writes: its `<tool_call>` blocks when it has any well-formed one, else every fenced JSON
    object (or list of objects) with a `name` and `arguments` (or `parameters`). Never raises."""
    from agentrl_ray.chat_format import parse_tool_calls

    parsed = parse_tool_calls(text)
    if parsed.calls and not parsed.errors:
        return [(c.name, c.arguments) for c in parsed.calls]
    calls = []
    for block in fenced_blocks(text):
        try:
            obj = json.loads(block)
        except ValueError:
            continue
        for item in obj if isinstance(obj, list) else [obj]:
            if (call := _as_call(item)) is not None:
                calls.append(call)
    return calls


def first_answer(record: dict) -> str:
    """The first assistant turn's text of a transcript record (`agentrl-ray eval`'s transcripts.jsonl)."""
    return next((m.get("content") or "" for m in record["messages"] if m["role"] == "assistant"), "")


def _loaded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def lenient_verdict(answer: str, row: dict) -> bool:
    from agentrl_ray.tasks.bfcl.matcher import check

    functions, truth = (_loaded(row[k]) for k in ("functions", "ground_truth"))
    return check(lenient_calls(answer), functions, truth, row["category"]).valid


# A call written as bare JSON or in a tag the lenient reader does not take: such an answer scores as "no call", but
# it is not a refusal to teach.
_CALL_LIKE = re.compile(r'"(?:name|arguments|parameters|function)"\s*:|<tool_call>|<function')


def refusal_worth_keeping(answer: str, record: dict) -> bool:
    """An answer without calls is kept as a refusal only when it is words: finished (not cut at the token limit) and
    with nothing call-like in it (the untrained model often writes an invented function's call as bare JSON)."""
    return record.get("finish_reason", "done") == "done" and not _CALL_LIKE.search(answer)


def distill(
    transcripts: Path | list[Path],
    rows_file: Path | list[Path],
    out: Path,
    per_task: int = 1,
    reference: Path | None = None,
    fill: tuple[str, ...] = (),
) -> dict:
    """SFT rows (a `datasets` folder at `out`: messages, tools, id) from the accepted answers in `transcripts` (an
    `agentrl-ray eval --out` folder's transcripts.jsonl over `rows_file`, or several such pairs, e.g. the AST tasks'
    samples and the irrelevance tasks'); returns counts per category. An accepted answer with calls is written back
    as those calls; one without (an irrelevance task's refusal) is kept in the model's own words when
    `refusal_worth_keeping`. With `reference` (the train split's reference conversations, make_data.py's sft/ folder)
    and `fill` categories, a sampled task of those categories with no accepted answer gets its reference answer
    instead: what the model never writes (several calls in one turn) is taught from the train split's answers."""
    from datasets import Dataset, load_from_disk

    transcript_files = transcripts if isinstance(transcripts, list) else [transcripts]
    rows_files = rows_file if isinstance(rows_file, list) else [rows_file]
    if len(transcript_files) != len(rows_files):
        raise ValueError(f"{len(transcript_files)} transcript files for {len(rows_files)} row files: pair them")
    rows = {str(r["id"]): r for f in rows_files for r in map(json.loads, f.read_text().splitlines())}
    records = [json.loads(line) for f in transcript_files for line in f.read_text().splitlines()]
    kept: dict[str, int] = {}
    seen: dict[str, int] = {}
    accepted: dict[str, int] = {}
    dropped_refusals = 0
    conversations = []
    for record in records:
        row = rows[str(record["id"])]
        category = row["category"]
        seen[category] = seen.get(category, 0) + 1
        answer = first_answer(record)
        if not lenient_verdict(answer, row):
            continue
        accepted[category] = accepted.get(category, 0) + 1
        calls = [
            {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for name, args in lenient_calls(answer)
        ]
        if not calls and not refusal_worth_keeping(answer, record):
            dropped_refusals += 1
            continue
        if kept.get(row["id"], 0) >= per_task:
            continue
        kept[row["id"]] = kept.get(row["id"], 0) + 1
        prompt = [m for m in record["messages"] if m["role"] in ("system", "user")]
        content = "" if calls else answer.strip()
        conversations.append(
            {
                "messages": [*prompt, {"role": "assistant", "content": content, "tool_calls": calls}],
                "tools": json.dumps(row["tools"]),
                "id": row["id"],
            }
        )
    filled: dict[str, int] = {}
    if reference is not None and fill:
        sampled = {str(r["id"]) for r in records}
        for ref in load_from_disk(str(reference)):
            row = rows.get(str(ref["id"]))
            if row and row["id"] in sampled and row["category"] in fill and row["id"] not in kept:
                filled[row["category"]] = filled.get(row["category"], 0) + 1
                conversations.append({"messages": ref["messages"], "tools": ref["tools"], "id": ref["id"]})
    Dataset.from_list(conversations).save_to_disk(str(out))
    tasks_kept = {c: sum(1 for i in kept if rows[i]["category"] == c) for c in seen}
    return {
        "samples": seen,
        "accepted_samples": accepted,
        "tasks_kept": tasks_kept,
        "reference_rows": filled,
        "refusals_not_kept": dropped_refusals,
        "rows": len(conversations),
        "sampled_lenient_pass": sum(accepted.values()) / max(1, sum(seen.values())),
    }
