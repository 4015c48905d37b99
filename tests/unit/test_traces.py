"""Traces: rollouts saved as OpenAI-style messages, converted to datasets that TRL's trainers accept, and `sft`."""

import json

import pytest

pytest.importorskip("trl")

from datasets import load_from_disk  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl.data_utils import is_conversational, maybe_apply_chat_template, unpair_preference_dataset  # noqa: E402

from agentrl_ray.chat_format import parse_tool_calls  # noqa: E402
from agentrl_ray.messages import assistant_message, from_openai, to_openai, tool_messages  # noqa: E402
from agentrl_ray.run.outputs import write_rollouts  # noqa: E402
from agentrl_ray.traces.convert import build_rows, save_dataset  # noqa: E402
from agentrl_ray.traces.records import group_records, read_records  # noqa: E402
from agentrl_ray.types import Trajectory, TrajectoryGroup  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": []},
        },
    }
]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'


def conversation(question: str, tool: bool, answer: str) -> tuple[list[dict], list[dict]]:
    prompt = [{"role": "user", "content": question}]
    completion = []
    if tool:
        first = assistant_message(CALL, parse_tool_calls(CALL), turn=0)
        completion += [first, *tool_messages(first, ["408"])]
    completion.append(assistant_message(answer, parse_tool_calls(answer), turn=len(completion)))
    return prompt, completion


def trajectory(prompt_id: str, index: int, reward: float, tool: bool, answer: str) -> Trajectory:
    prompt, completion = conversation("What is 12 * 34?", tool, answer)
    return Trajectory(
        prompt_id=prompt_id,
        sample_index=index,
        token_ids=[1, 2, 3],
        action_mask=[0, 1, 1],
        env_mask=[0, 0, 0],
        template_mask=[0, 0, 0],
        rollout_logprobs=[0.0, -1.0, -1.0],
        reward=reward,
        policy_version=3,
        finish_reason="answer",
        prompt_len=1,
        reward_parts={"answer_match": reward},
        num_tool_calls=int(tool),
        prompt_messages=prompt,
        completion_messages=completion,
    )


def test_structured_messages_and_openai_round_trip():
    prompt, completion = conversation("q", True, "The answer is 408.")
    call = completion[0]["tool_calls"][0]
    assert completion[0]["content"] == "" and call["function"]["arguments"] == {"expression": "12 * 34"}
    assert completion[1] == {"role": "tool", "content": "408", "name": "calculator", "tool_call_id": call["id"]}
    wire = to_openai(completion)
    assert json.loads(wire[0]["tool_calls"][0]["function"]["arguments"]) == {"expression": "12 * 34"}
    assert from_openai(wire) == completion
    # A malformed turn keeps its raw text, so a measure can still see what was wrong.
    bad = "<tool_call>{oops</tool_call>"
    assert assistant_message(bad, parse_tool_calls(bad), 0) == {"role": "assistant", "content": bad}
    with pytest.raises(ValueError, match=r"log\[0\]: tool call arguments are not JSON"):
        from_openai([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}], "log")


def test_rollouts_to_records_to_every_dataset(tmp_path):
    groups = [
        TrajectoryGroup(
            "p1",
            [trajectory("p1", 0, 1.0, True, "The answer is 408."), trajectory("p1", 1, 0.0, False, "It is 400.")],
        ),
        TrajectoryGroup("p2", [trajectory("p2", i, 0.0, False, "It is 400.") for i in range(2)]),
    ]
    rows = {"p1": {"id": "p1", "prompt": "x", "answer": "408"}, "p2": {"id": "p2", "prompt": "x", "answer": "408"}}
    write_rollouts(tmp_path, 7, group_records(groups, 7, rows, TOOLS))
    line = json.loads((tmp_path / "rollouts" / "step_000007.jsonl").read_text().splitlines()[0])
    assert isinstance(line["completion"][0]["tool_calls"][0]["function"]["arguments"], str)  # OpenAI wire form
    records = read_records(tmp_path)
    assert len(records) == 4 and records[0].columns == {"answer": "408"}

    sft = build_rows(records, "sft")
    assert len(sft) == 1 and [m["role"] for m in sft[0]["messages"]] == ["user", "assistant", "tool", "assistant"]
    pref = build_rows(records, "preference")
    assert len(pref) == 1 and pref[0]["score_chosen"] == 1.0  # p2's samples all scored 0: no pair
    kto = build_rows(records, "kto")
    assert [r["label"] for r in kto] == [True, False, False, False]
    grpo = build_rows(records, "grpo")
    assert grpo == [
        {"id": "p1", "prompt": [{"role": "user", "content": "What is 12 * 34?"}], "answer": "408"},
        {"id": "p2", "prompt": [{"role": "user", "content": "What is 12 * 34?"}], "answer": "408"},
    ]
    save_dataset(grpo, tmp_path / "grpo")
    assert load_from_disk(str(tmp_path / "grpo"))[0]["answer"] == "408"


def openai_log(tmp_path):
    """Agent logs from elsewhere: OpenAI messages (null content beside tool_calls, string arguments), a label."""
    lines = []
    for i in range(3):
        for good in (True, False):
            messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": f"What is {i} * 34?"}]
            if good:
                call = {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "1"}'},
                }
                messages += [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": str(i * 34)},
                ]
            messages.append({"role": "assistant", "content": f"The answer is {i * 34 if good else 7}."})
            lines.append({"messages": messages, "success": good, "tools": TOOLS})
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_openai_logs_become_datasets_trl_accepts(tmp_path, builtin_model_path):
    """Preference pairs and KTO rows tokenized by DPOTrainer's and KTOTrainer's own dataset preparation, and read by
    TRL's data utilities."""
    from trl import DPOConfig, DPOTrainer

    records = read_records(openai_log(tmp_path))
    assert records[0].prompt[0]["role"] == "system" and records[0].completion[0]["content"] == ""
    pref = save_dataset(build_rows(records, "preference"), tmp_path / "pref")
    kto = save_dataset(build_rows(records, "kto"), tmp_path / "kto")
    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    for example in kto:
        assert is_conversational(example)
        text = maybe_apply_chat_template(example, tok, tools=json.loads(example["tools"]))
        assert text["prompt"].startswith("<|im_start|>system") and "label" in text
    assert "<tool_call>" in maybe_apply_chat_template(kto[0], tok)["completion"]
    unpaired = unpair_preference_dataset(pref)
    assert sorted(unpaired.column_names) == ["completion", "label", "prompt", "score_chosen", "score_rejected", "tools"]
    assert sum(unpaired["label"]) == len(pref) == 3
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), report_to="none", use_cpu=True, bf16=False, max_length=256)
    trainer = DPOTrainer(model=builtin_model_path, args=args, train_dataset=pref, processing_class=tok)
    from trl.experimental.kto import KTOConfig, KTOTrainer

    args = KTOConfig(output_dir=str(tmp_path / "kto_out"), report_to="none", use_cpu=True, bf16=False, max_length=256)
    kto_trainer = KTOTrainer(model=builtin_model_path, args=args, train_dataset=kto, processing_class=tok)
    assert "<tool_call>" in tok.decode(kto_trainer.train_dataset[0]["completion_ids"])
    row = trainer.train_dataset[0]
    chosen = tok.decode(row["chosen_ids"])
    assert "<tool_call>" in chosen and "\n0\n</tool_response>" in chosen and chosen.endswith("answer is 0.<|im_end|>\n")


def test_bad_trace_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a trace record needs a numeric 'reward'"):
        read_records(path)
    path.write_text('{"messages": [{"role": "user", "content": "q"}], "reward": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: the messages hold no assistant message"):
        read_records(path)
    with pytest.raises(ValueError, match="no prompt among 1 records has samples of different rewards"):
        build_rows(read_records(_one(tmp_path)), "preference")


def _one(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "reward": 1}\n'
    )
    return path


def test_sft_warm_start_trains_and_saves_a_loadable_model(tmp_path, builtin_model_path):
    from transformers import AutoModelForCausalLM

    from agentrl_ray.traces.sft import SFTOptions, run_sft

    save_dataset(build_rows(read_records(openai_log(tmp_path)), "sft"), tmp_path / "sft")
    summary = run_sft(
        str(tmp_path / "sft"), builtin_model_path, str(tmp_path / "out"), SFTOptions(epochs=1, batch_size=3)
    )
    assert summary["rows"] == 3 and summary["steps"] == 1
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out") is not None
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template is not None


def test_sft_head_scores_only_the_completion_with_the_same_loss_and_gradients(builtin_model_path):
    """`completion_positions_only`: TRL's fused head on CPU sees only the labelled rows, and nothing it computes
    changes (the loss and every gradient), so the warm start is the same, only faster."""
    import torch
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from agentrl_ray.traces.sft import completion_positions_only

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(builtin_model_path)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    labels = ids.clone()
    labels[:, :18] = -100  # a long prompt, a short completion: 2 x 6 labelled next-token positions
    seen = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        seen.append(hidden.shape[0])
        return apply(hidden, *args)

    def run():
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    trl_utils._ChunkedLogProbFunction.apply = spy
    try:
        every, every_grads = run()
        with completion_positions_only():
            compact, compact_grads = run()
        assert trl_utils._use_triton(torch.device("cpu")) is False  # restored on exit
    finally:
        trl_utils._ChunkedLogProbFunction.apply = apply
    assert seen == [2 * 23, 2 * 6]
    torch.testing.assert_close(compact.loss, every.loss)
    torch.testing.assert_close(compact.entropy, every.entropy)
    assert torch.equal(compact.is_top1, every.is_top1)
    for a, b in zip(compact_grads, every_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_sft_rows_are_tokenized_before_arrow_gives_an_answer_a_null_tool_calls(builtin_model_path):
    """Llama 3's template reads a `tool_calls` key as a call whatever its value; Arrow gives every message one."""
    from family_models import calculator_conversations
    from test_tool_format import family

    from agentrl_ray.builtin.tokenizer import load_tokenizer
    from agentrl_ray.traces.sft import prompt_completion, tokenized

    tok = family(load_tokenizer(builtin_model_path), "llama3_2")
    [row] = prompt_completion(calculator_conversations(1))
    from datasets import Dataset

    assert Dataset.from_list([row])[0]["completion"][-1]["tool_calls"] is None  # what TRL would render
    [out] = tokenized(tok, [row])
    completion = tok.decode([i for i, m in zip(out["input_ids"], out["completion_mask"]) if m])
    assert completion.startswith('{"name": "calculator", "parameters": {"expression": ')
    answer = row["completion"][-1]["content"]  # a plain answer, not a call with null arguments
    assert completion.endswith(f"<|start_header_id|>assistant<|end_header_id|>\n\n{answer}<|eot_id|>")
    assert completion.count('"parameters"') == 1
