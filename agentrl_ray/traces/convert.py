"""Trace records → Hugging Face datasets in the layouts TRL's trainers read.

- `sft`:        successful conversations: `messages` (prompt + completion) and `tools` (a JSON string, as TRL's
                SFTTrainer accepts it).
- `kto`:        every trajectory, unpaired: `prompt`, `completion`, `label` (True when successful).
- `preference`: one pair per prompt whose samples differ in reward: `prompt`, `chosen` (the best), `rejected` (the
                worst).
- `grpo`:       the distinct prompts with the columns reward functions read (`prompt`, `id`, e.g. `answer`): a
                `data.train` for `agentrl-ray train` or TRL's GRPOTrainer.

Messages are stored in OpenAI form (tool-call arguments as JSON strings): Arrow needs one type per column, which
dict arguments of different tools do not have, and chat templates in the Qwen2.5 layout render a string as is.
Every converter fails with a clear message when nothing qualifies, rather than saving an empty dataset.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrl_ray.messages import to_openai
from agentrl_ray.traces.records import TraceRecord

FORMATS = ("sft", "kto", "preference", "grpo")


def successful(record: TraceRecord, threshold: float) -> bool:
    return record.reward >= threshold


def sft_rows(records: list[TraceRecord], threshold: float = 1.0) -> list[dict[str, Any]]:
    rows = [
        {"messages": to_openai(r.prompt + r.completion), "tools": json.dumps(r.tools)}
        for r in records
        if successful(r, threshold) and r.completion and r.completion[-1]["role"] == "assistant"
    ]
    if not rows:
        raise ValueError(f"no successful trajectory (reward >= {threshold}) among {len(records)} records")
    return rows


def kto_rows(records: list[TraceRecord], threshold: float = 1.0) -> list[dict[str, Any]]:
    rows = [
        {
            "prompt": to_openai(r.prompt),
            "completion": to_openai(r.completion),
            "label": successful(r, threshold),
            "tools": json.dumps(r.tools),
        }
        for r in records
    ]
    labels = {row["label"] for row in rows}
    if labels != {True, False}:
        raise ValueError(f"KTO needs both desirable and undesirable samples; all {len(rows)} are label={labels}")
    return rows


def preference_rows(records: list[TraceRecord]) -> list[dict[str, Any]]:
    """Best vs worst of each prompt's samples (first of equals), for prompts whose rewards are not all equal."""
    rows = []
    for group in _by_prompt(records).values():
        best = max(group, key=lambda r: r.reward)
        worst = min(group, key=lambda r: r.reward)
        if best.reward > worst.reward:
            rows.append(
                {
                    "prompt": to_openai(best.prompt),
                    "chosen": to_openai(best.completion),
                    "rejected": to_openai(worst.completion),
                    "tools": json.dumps(best.tools),
                    "score_chosen": best.reward,
                    "score_rejected": worst.reward,
                }
            )
    if not rows:
        raise ValueError(f"no prompt among {len(records)} records has samples of different rewards: no pairs")
    return rows


def grpo_rows(records: list[TraceRecord]) -> list[dict[str, Any]]:
    rows = []
    for prompt_id, group in _by_prompt(records).items():
        first = group[0]
        rows.append({"id": prompt_id, "prompt": to_openai(first.prompt), **first.columns})
    return rows


def _by_prompt(records: list[TraceRecord]) -> dict[str, list[TraceRecord]]:
    groups: dict[str, list[TraceRecord]] = defaultdict(list)
    for r in records:
        groups[r.prompt_id].append(r)
    return groups


def build_rows(records: list[TraceRecord], fmt: str, threshold: float = 1.0) -> list[dict[str, Any]]:
    if fmt == "sft":
        return sft_rows(records, threshold)
    if fmt == "kto":
        return kto_rows(records, threshold)
    if fmt == "preference":
        return preference_rows(records)
    if fmt == "grpo":
        return grpo_rows(records)
    raise ValueError(f"unknown trace dataset format {fmt!r}: use one of {', '.join(FORMATS)}")


def save_dataset(rows: list[dict[str, Any]], out_dir: str | Path):
    """`datasets.Dataset.save_to_disk` of the rows; returns the dataset."""
    from datasets import Dataset

    ds = Dataset.from_list(rows)
    ds.save_to_disk(str(out_dir))
    return ds
