"""The self-distilled warm start (benchmarks/suite/real_model/self_distill.py): answers read leniently (fenced JSON
calls count), only the ones BFCL's check accepts kept, written back as structured calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def sd(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from suite.real_model import self_distill

    return self_distill


def test_fenced_json_objects_and_lists_are_calls_and_tool_call_blocks_win(sd):
    text = 'Here:\n```json\n{"name": "f", "arguments": {"a": 1}}\n```\nthen\n```\n[{"name": "g", "parameters": {}}]\n'
    text += "```"
    assert sd.lenient_calls(text) == [("f", {"a": 1}), ("g", {})]
    assert sd.lenient_calls('```json\n{"name": "f", "arguments": "{\\"a\\": 2}"}\n```') == [("f", {"a": 2})]
    tagged = '<tool_call>\n{"name": "h", "arguments": {}}\n</tool_call>\n```json\n{"name": "f", "arguments": {}}\n```'
    assert sd.lenient_calls(tagged) == [("h", {})]
    for broken in ("```", "```json\n{not json}\n```", '```json\n{"arguments": {}}\n```', "```json\n[1, 2]\n```", ""):
        assert sd.lenient_calls(broken) == [], broken


def test_a_long_run_of_fences_is_read_in_one_pass(sd):
    assert sd.fenced_blocks("```\n" * 20_001) == ["" for _ in range(10_000)]


def _row(i: int, category: str, value: int) -> dict:
    doc = {"name": "f", "description": "", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}}}
    return {
        "id": f"{category}_{i}",
        "category": category,
        "prompt": [{"role": "user", "content": f"call f with {value}"}],
        "tools": [{"type": "function", "function": {**doc, "parameters": {**doc["parameters"], "type": "object"}}}],
        "functions": json.dumps([{**doc, "required": ["x"]}]),
        "ground_truth": json.dumps([{"f": {"x": [value]}}]),
    }


def _record(row: dict, sample: int, answer: str) -> dict:
    return {"id": row["id"], "sample": sample, "messages": [*row["prompt"], {"role": "assistant", "content": answer}]}


def test_only_accepted_answers_are_kept_once_a_task_as_structured_calls(sd, tmp_path):
    from datasets import load_from_disk

    rows = [_row(0, "simple_python", 3), _row(1, "simple_python", 4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def fenced(x):
        return f'```json\n{{"name": "f", "arguments": {{"x": {x}}}}}\n```'

    records = [
        _record(rows[0], 0, fenced(3)),
        _record(rows[0], 1, fenced(3)),  # a second accepted answer to the same task: not kept
        _record(rows[1], 0, fenced(5)),  # wrong value
        _record(rows[1], 1, "no call"),
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    counts = sd.distill(tmp_path / "t.jsonl", tmp_path / "rows.jsonl", tmp_path / "sft")
    assert counts["rows"] == 1 and counts["accepted_samples"] == {"simple_python": 2}
    assert counts["sampled_lenient_pass"] == 0.5
    (only,) = load_from_disk(str(tmp_path / "sft"))
    assert only["id"] == "simple_python_0" and only["messages"][0]["content"] == "call f with 3"
    answer = only["messages"][-1]
    assert answer["role"] == "assistant" and answer["content"] == ""
    assert [json.loads(c["function"]["arguments"]) for c in answer["tool_calls"]] == [{"x": 3}]
    assert json.loads(only["tools"]) == rows[0]["tools"]


def test_a_fill_category_without_an_accepted_answer_takes_the_reference_answer(sd, tmp_path):
    from datasets import Dataset, load_from_disk

    rows = [_row(0, "simple_python", 3), _row(1, "parallel", 4), _row(2, "parallel", 5)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = [_record(rows[0], 0, "no call"), _record(rows[1], 0, "no call")]  # row 2 was not sampled
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 4}'}}
    reference = [
        {"id": r["id"], "tools": json.dumps(r["tools"]), "messages": [*r["prompt"], {"role": "assistant", "content": "",
         "tool_calls": [call]}]}
        for r in rows
    ]  # fmt: skip
    Dataset.from_list(reference).save_to_disk(str(tmp_path / "ref"))
    counts = sd.distill(tmp_path / "t.jsonl", tmp_path / "rows.jsonl", tmp_path / "sft", reference=tmp_path / "ref",
                        fill=("parallel",))  # fmt: skip
    assert counts["reference_rows"] == {"parallel": 1} and counts["rows"] == 1
    (only,) = load_from_disk(str(tmp_path / "sft"))
    assert only["id"] == "parallel_1" and only["messages"][-1]["tool_calls"][0]["function"]["arguments"] == '{"x": 4}'


def test_an_accepted_refusal_is_kept_in_the_models_own_words(sd, tmp_path):
    from datasets import load_from_disk

    rows = [{**_row(0, "irrelevance", 3), "ground_truth": "[]"}, _row(1, "simple_python", 4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = [
        _record(rows[0], 0, '```json\n{"name": "f", "arguments": {"x": 3}}\n```'),  # a call where none fits
        _record(rows[0], 1, "None of the functions can answer this. "),
        _record(rows[1], 0, '<tool_call>\n{"name": "f", "arguments": {"x": 4}}\n</tool_call>'),
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    counts = sd.distill(tmp_path / "t.jsonl", tmp_path / "rows.jsonl", tmp_path / "sft")
    assert counts["accepted_samples"] == {"irrelevance": 1, "simple_python": 1}
    refusal, call = load_from_disk(str(tmp_path / "sft"))
    assert refusal["messages"][-1]["content"] == "None of the functions can answer this."
    assert not refusal["messages"][-1]["tool_calls"]
    assert call["messages"][-1]["content"] == "" and len(call["messages"][-1]["tool_calls"]) == 1


def test_a_refusal_is_kept_only_when_it_is_finished_words_and_pairs_of_files_are_read(sd, tmp_path):
    """The untrained model often answers an irrelevance task with an invented function's call as bare JSON (no call to
    the lenient reader, so BFCL accepts it) or runs out of tokens: neither is a refusal to teach. The AST samples and
    the irrelevance samples come as two (transcripts, rows) pairs."""
    from datasets import load_from_disk

    irrelevant = [{**_row(i, "irrelevance", 0), "ground_truth": "[]"} for i in range(4)]
    ast = [_row(0, "simple_python", 4)]
    (tmp_path / "irr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in irrelevant))
    (tmp_path / "ast.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ast))
    irr_records = [
        _record(irrelevant[0], 0, '{"name": "area", "arguments": {"base": 10}}'),  # bare JSON: a call, not words
        {**_record(irrelevant[1], 0, "The answer is that one would need to"), "finish_reason": "length"},
        {**_record(irrelevant[2], 0, "No function here computes that."), "finish_reason": "done"},
        _record(irrelevant[3], 0, '<tool_call>\n{"name": "nope"'),  # a broken tag
    ]
    (tmp_path / "irr_t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in irr_records))
    (tmp_path / "ast_t.jsonl").write_text(json.dumps(_record(ast[0], 0, '```json\n{"name": "f", "arguments": '
                                                             '{"x": 4}}\n```')) + "\n")  # fmt: skip
    counts = sd.distill(
        [tmp_path / "ast_t.jsonl", tmp_path / "irr_t.jsonl"], [tmp_path / "ast.jsonl", tmp_path / "irr.jsonl"],
        tmp_path / "sft",
    )  # fmt: skip
    assert counts["accepted_samples"] == {"simple_python": 1, "irrelevance": 4}
    assert counts["refusals_not_kept"] == 3 and counts["rows"] == 2
    call, refusal = load_from_disk(str(tmp_path / "sft"))
    assert call["id"] == "simple_python_0" and len(call["messages"][-1]["tool_calls"]) == 1
    assert refusal["id"] == "irrelevance_2" and refusal["messages"][-1]["content"] == "No function here computes that."
    with pytest.raises(ValueError, match="pair them"):
        sd.distill([tmp_path / "ast_t.jsonl"], [tmp_path / "ast.jsonl", tmp_path / "irr.jsonl"], tmp_path / "x")
