"""The gsm_tools task (agentrl_ray/tasks/gsm.py, examples/gsm_tools/): held-out questions never reach train rows or
worked solutions, rows are deterministic, `rg_score` thresholds reasoning-gym's partial credit away and never raises on
a malformed completion, and every worked solution replays through the calculator to an answer scored 1.0."""

from __future__ import annotations

import json
import sys

import pytest

from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.tasks import gsm

pytest.importorskip("reasoning_gym")

from examples.gsm_tools.make_data import sft_rows, write  # noqa: E402
from examples.gsm_tools.reward import rg_score  # noqa: E402

DATASETS = sorted(gsm.DATASETS)


def _question(row: dict) -> str:
    return json.loads(row["rg_entry"])["question"]


@pytest.mark.parametrize("dataset", DATASETS)
def test_no_held_out_question_in_train_rows_of_any_seed(dataset):
    held_out = {_question(r) for r in gsm.make_rows(dataset, 400, "eval", seed=0)}
    for seed in (0, 1):
        train = gsm.make_rows(dataset, 1000, "train", seed=seed)
        assert len(train) == 1000
        assert not held_out & {_question(r) for r in train}
        assert len({_question(r) for r in train}) == len(train)  # no repeats within a split either
    assert gsm.generator_seed("train", 0) != gsm.generator_seed("eval", 0)
    # Seeds closer than the entries read would share them: reasoning-gym seeds entry i with Random(seed + i).
    assert abs(gsm.generator_seed("train", 0) - gsm.generator_seed("eval", 0)) >= gsm.SEED_STRIDE


@pytest.mark.parametrize("dataset", DATASETS)
def test_rows_are_deterministic_and_complete(dataset):
    rows = gsm.make_rows(dataset, 50, "train", seed=3)
    assert rows == gsm.make_rows(dataset, 50, "train", seed=3)
    assert rows[:20] == gsm.make_rows(dataset, 20, "train", seed=3)  # a prefix: more rows never reshuffle
    assert rows != gsm.make_rows(dataset, 50, "train", seed=4)
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        entry = json.loads(row["rg_entry"])
        assert row["prompt"] == [{"role": "user", "content": f"{entry['question']}\n{gsm.INSTRUCTION}"}]
        assert row["answer"] == entry["answer"] and row["dataset"] == entry["metadata"]["source_dataset"] == dataset
        assert "answer_cot" not in entry["metadata"]  # the worked solution stays out of the rows


def test_every_row_is_answerable():
    """gsm_symbolic's comet template sometimes asks for an age of -1, which its own scorer cannot read (it drops the
    sign): such entries are left out, and every row's answer, written as the instruction asks, scores 1.0."""
    rg = gsm.reasoning_gym()
    raw = rg.create_dataset("gsm_symbolic", seed=gsm.generator_seed("train", 0), size=gsm.SEED_STRIDE)
    first_negative = next(i for i in range(20_000) if float(raw[i]["answer"]) < 0)
    rows = []
    for index, entry in gsm.entries("gsm_symbolic", "train"):
        if index > first_negative:
            break
        rows.append(gsm.row_of("gsm_symbolic", "train", 0, index, entry))
    assert f"gsm_symbolic-train-0-{first_negative}" not in {r["id"] for r in rows}
    completions = [f"The answer is {r['answer']}." for r in rows]
    assert rg_score(completions, [r["rg_entry"] for r in rows]) == [1.0] * len(rows)


def _right_and_wrong(dataset):
    row = next(r for r in gsm.make_rows(dataset, 100, "eval") if r["answer"].isdigit() and int(r["answer"]) >= 1000)
    return row, int(row["answer"]), int(row["answer"]) + 1


@pytest.mark.parametrize("dataset", DATASETS)
def test_rg_score_right_wrong_and_partial_credit(dataset):
    row, right, wrong = _right_and_wrong(dataset)
    entry = row["rg_entry"]
    structured = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator"}}]},
        {"role": "tool", "content": str(right)},
        {"role": "assistant", "content": f"The answer is {right:,}."},  # thousands separators are read too
    ]
    completions = [f"The answer is {right}.", structured, f"The answer is {wrong}.", "I do not know."]
    assert rg_score(completions, [entry] * 4) == [1.0, 1.0, 0.0, 0.0]
    # reasoning-gym's own score gives a wrong number partial credit, which the threshold drops.
    score_answer = gsm.reasoning_gym().get_score_answer_fn(dataset)
    near_miss = str(wrong) if dataset == "gsm_symbolic" else f"1{right}"  # chain_sum credits a substring
    assert 0.0 < score_answer(near_miss, json.loads(entry)) < 1.0
    assert rg_score([f"The answer is {near_miss}."], [entry]) == [0.0]


def test_rg_score_partial_credit_values():
    """What reasoning-gym gives answers short of right: gsm_symbolic 0.01 for any wrong number, chain_sum the
    length ratio when the answer is a substring of what was given."""
    score = gsm.reasoning_gym().get_score_answer_fn
    assert score("gsm_symbolic")("7", {"answer": "6"}) == 0.01
    assert score("chain_sum")("123", {"answer": "23"}) == pytest.approx(2 / 3)
    assert score("chain_sum")("45", {"answer": "23"}) == 0.0
    assert gsm.threshold_score("7", json.dumps({"answer": "6", "metadata": {"source_dataset": "gsm_symbolic"}})) == 0.0


def test_rg_score_never_raises_on_malformed_completions():
    row, right, _ = _right_and_wrong("chain_sum")
    malformed = [
        None,
        5,
        "",
        [],
        [{"content": f"The answer is {right}."}],  # no role
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "content": 42}],
        ["The answer is"],
        [{"role": "assistant", "content": f'<tool_call>\n{{"name": "calculator"}}\n</tool_call> {right}'}],  # a call
        [{"role": "assistant", "content": f"<tool_call> {right}"}],  # cut off mid-call
    ]
    assert rg_score(malformed, [row["rg_entry"]] * len(malformed)) == [0.0] * len(malformed)
    # An unreadable entry is "does not apply" (None: 0.0 in the total, counted as rg_score/none), never an exception.
    bad_entries = ["", "{", "[]", json.dumps({"answer": "1"}), json.dumps({"answer": "1", "metadata": {}}), None]
    bad_entries.append(json.dumps({"answer": "1", "metadata": {"source_dataset": "no_such_dataset"}}))
    assert rg_score(["The answer is 1."] * len(bad_entries), bad_entries) == [None] * len(bad_entries)


def test_missing_reasoning_gym_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now fails
    with pytest.raises(ModuleNotFoundError, match=r"pip install reasoning-gym==0\.1\.25"):
        gsm.make_rows("chain_sum", 1, "train")


def _replay(messages: list[dict]) -> tuple[list[str], list[str]]:
    """(what CalculatorEnv answers to every call, the tool messages of the conversation)."""
    env = CalculatorEnv()
    env.reset()
    called, recorded = [], []
    for m in messages:
        for call in m.get("tool_calls") or []:
            assert call["function"]["name"] == "calculator"
            called.append(env.calculator(**call["function"]["arguments"]))
        if m["role"] == "tool":
            recorded.append(m["content"])
    return called, recorded


@pytest.mark.parametrize("dataset,n", [("chain_sum", 50), ("gsm_symbolic", 150)])
def test_worked_solutions_replay_through_the_calculator_to_a_right_answer(dataset, n):
    rows, skipped = sft_rows(dataset, n, seed=0)
    assert len(rows) == n
    if dataset == "chain_sum":
        assert not skipped  # its expression is in the question
    else:  # most word problems have one (87% measured); the rest are counted by reason
        assert sum(skipped.values()) < 0.25 * n
    held_out = {_question(r) for r in gsm.make_rows(dataset, 400, "eval", seed=0)}
    train_prompts = {r["id"]: r["prompt"] for r in gsm.make_rows(dataset, 2 * n, "train", seed=0)}
    turns = 0
    for row in rows:
        messages = row["messages"]
        assert messages[0] == train_prompts[row["id"]][0] and _question(row) not in held_out
        assert json.loads(row["tools"])[0]["function"]["name"] == "calculator"
        called, recorded = _replay(messages)
        assert called == recorded and called
        final = messages[-1]
        assert final["role"] == "assistant" and not final.get("tool_calls")
        assert final["content"] == f"The answer is {recorded[-1]}."
        assert rg_score([messages[1:]], [row["rg_entry"]]) == [1.0]
        turns = max(turns, sum(m["role"] == "assistant" for m in messages))
    assert turns == 2 if dataset == "chain_sum" else turns > 2


def test_worked_turns_read_a_solution_text():
    entry = {
        "question": "Mia works 11 hours at €34/hour and 3 hours at €20/hour, and pays 25% tax. What is left?",
        "answer": "325.5",
        "metadata": {
            "source_dataset": "gsm_symbolic",
            "answer_cot": "She earns €34/hour * 11 hours = €374 and 3 x €20 = €60.\n"
            "In total €374 + €60 = €434, so 374 + 60 = 434.\n"  # a restated step
            "The tax is $434 * 25% = $108.5, so 434 - 108.5 = 325.5 is left.\n"
            "Per hour that is 325.5 / 14 = 23.25.\n"  # past the answer: dropped (14 is in no question)
            "#### 325.5",
        },
    }
    turns = gsm.worked_turns(entry)
    assert [[s.expression for s in t] for t in turns] == [
        ["34 * 11", "3 * 20"],  # independent steps share a turn; unit words and currency signs are dropped
        ["374 + 60"],
        ["434 * (25 / 100)"],
        ["434 - 108.5"],
    ]
    assert [s.value for t in turns for s in t] == [374, 60, 434, 108.5, 325.5]
    env = CalculatorEnv()
    assert [env.calculator(s.expression) for t in turns for s in t] == ["374", "60", "434", "108.5", "325.5"]


def test_worked_turns_refuse_what_is_not_arithmetic():
    def entry(cot: str, answer: str = "10") -> dict:
        metadata = {"source_dataset": "gsm_symbolic", "answer_cot": cot}
        return {"question": "Tom has 4 boxes of 2 pens.", "answer": answer, "metadata": metadata}

    assert [[s.expression for s in t] for t in gsm.worked_turns(entry("4 * 2 = 8 pens, 8 + 2 = 10"))] == [
        ["4 * 2"],
        ["8 + 2"],
    ]
    with pytest.raises(ValueError, match="neither given nor computed"):
        gsm.worked_turns(entry("He has 37 + 4 = 41 pens", "41"))  # 37 comes from nowhere
    with pytest.raises(ValueError, match="comes to the answer"):
        gsm.worked_turns(entry("4 * 2 = 8 pens. So W = 10."))
    # percentages: as percentage points, as a ratio shown in percent, as a fraction of an amount
    [[points]] = gsm.worked_turns({**entry("100% - 25% = 75%", "75"), "question": "25% of a 100-item quiz"})
    assert (points.expression, points.value) == ("100 - 25", 75)
    [[ratio]] = gsm.worked_turns({**entry("8 / 32 * 100% = 25%", "25"), "question": "8 of 32"})
    assert (ratio.expression, ratio.value) == ("8 / 32 * 100", 25)


def test_make_data_writes_rows_and_a_dataset_the_sft_command_reads(tmp_path):
    from agentrl_ray.traces.sft import load_sft_rows, prompt_completion

    paths = write(tmp_path, "gsm_symbolic", n_train=32, n_eval=16, n_sft=8)
    train = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    evals = [json.loads(line) for line in paths["eval"].read_text().splitlines()]
    assert len(train) == 32 and len(evals) == 16
    assert not {_question(r) for r in train} & {_question(r) for r in evals}
    rows = prompt_completion(load_sft_rows(str(paths["sft"])))
    assert len(rows) == 8
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["completion"][-1]["content"].startswith("The answer is")
    call = rows[0]["completion"][0]["tool_calls"][0]
    assert set(call["function"]["arguments"]) == {"expression"}
