"""BFCL v4 multi-turn: the tasks and split, our judge against every ground truth and against BFCL's own
multi_turn_checker on wrong answers, and the environment that runs the model's calls turn by turn."""

from __future__ import annotations

import collections
import json
import uuid

import pytest

pytest.importorskip("bfcl_eval")

from agentrl_ray.chat_format import ToolCall, observation_segments, render_tool_call  # noqa: E402
from agentrl_ray.envs.host import _checked_step  # noqa: E402
from agentrl_ray.tasks.bfcl import multi_turn as mt  # noqa: E402
from examples.bfcl.multi_turn import BFCLMultiTurnEnv  # noqa: E402


def test_tasks_and_the_fixed_split():
    tasks = mt.load_tasks()
    assert len(tasks) == 200
    assert collections.Counter(t.split for t in tasks) == {"train": 151, "eval": 49}
    math = [t for t in tasks if "MathAPI" in t.classes]
    assert (len(math), sum(t.split == "eval" for t in math)) == (25, 6)
    assert {r["id"] for r in mt.rows("train")}.isdisjoint(r["id"] for r in mt.rows("eval"))
    row = mt.rows("eval", ("MathAPI",))[0]
    names = {t["function"]["name"] for t in row["tools"]}
    assert {"mean", "add"} <= names and all(t["type"] == "function" for t in row["tools"])


def test_excluded_functions_are_neither_shown_nor_callable():
    task = next(t for t in mt.load_tasks() if t.excluded)
    shown = {f["name"] for f in mt.task_functions(task)}
    assert not shown & set(task.excluded)
    judge = mt.Judge(task)
    assert judge.model_call(task.excluded[0], {}).startswith("Error during execution: no function named")
    assert task.excluded[0] in judge.truth.methods  # the ground truth's world still has it


def test_every_ground_truth_passes_every_turn():
    for task in mt.load_tasks():
        judge = mt.Judge(task)
        for truth in task.ground_truth:
            for call in truth:
                judge.model_call(*judge.truth.resolve(call))
            verdict = judge.end_turn()
            assert verdict.valid, (task.id, verdict.reason)
        assert judge.done and judge.passed == len(task.turns)


def _as_python(name: str, arguments: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _perturbed(task: mt.MultiTurnTask, kind: str, world: mt.World) -> list[list[str]]:
    """The task's answers changed in one way (calls in Python syntax, keyword arguments), per turn."""
    turns = [[_as_python(*world.resolve(c)) for c in truth] for truth in task.ground_truth]
    if kind == "truth":
        return turns
    if kind == "silent_first_turn":
        return [[], *turns[1:]]
    if kind == "drop_last_call":
        last = max((i for i, t in enumerate(turns) if t), default=None)
        return [t[:-1] if i == last else t for i, t in enumerate(turns)]
    if kind == "twice":  # every call made twice: same state for some, an error or a new state for others
        return [[c for c in t for _ in range(2)] for t in turns]
    if kind == "reversed":
        return [list(reversed(t)) for t in turns]
    if kind == "wrong_argument":
        out = [list(t) for t in turns]
        for t in out:
            for i, call in enumerate(t):
                name, arguments = world.resolve(call)
                for key, value in arguments.items():
                    if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
                        arguments[key] = value + ("x" if isinstance(value, str) else 1)
                        t[i] = _as_python(name, arguments)
                        return out
        return out
    raise ValueError(kind)


KINDS = ("truth", "silent_first_turn", "drop_last_call", "twice", "reversed", "wrong_argument")


def _ours(task: mt.MultiTurnTask, answers: list[list[str]]) -> bool:
    judge = mt.Judge(task)
    for calls in answers:
        for call in calls:
            judge.model_call(*judge.model.resolve(call))
        if not judge.end_turn().valid:
            return False
    return True


def test_our_verdicts_agree_with_bfcls_own_multi_turn_checker():
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    entries = {
        json.loads(line)["id"]: json.loads(line)
        for line in (mt.data_dir() / f"BFCL_v4_{mt.CATEGORY}.json").read_text().splitlines()
    }
    verdicts = collections.Counter()
    disagree = []
    for task in mt.load_tasks():
        for kind in KINDS:
            answers = _perturbed(task, kind, mt.World(task))
            # BFCL keeps its instances in module globals, keyed by model name and task: a fresh name per check.
            name = f"agentrl-{kind}-{uuid.uuid4().hex[:8]}"
            bfcl = multi_turn_checker(
                [[a] for a in answers], list(map(list, task.ground_truth)), entries[task.id], mt.CATEGORY, name
            )["valid"]
            ours = _ours(task, answers)
            verdicts[(kind, ours)] += 1
            if ours != bfcl:
                disagree.append((task.id, kind, ours, bfcl))
    assert not disagree, disagree[:10]
    assert verdicts[("truth", True)] == 200
    assert verdicts[("silent_first_turn", False)] == 200  # every task's first turn expects calls
    # Both verdicts among the 1,000 changed answers (bfcl-eval 2026.3.23: 175 still right, e.g. two independent
    # calls reversed, 825 wrong), so the agreement is not only on the obvious.
    assert sum(n for (k, ok), n in verdicts.items() if k != "truth" and ok) >= 100
    assert sum(n for (k, ok), n in verdicts.items() if not ok) >= 600


def _call_text(judge: mt.Judge, call: str) -> str:
    name, arguments = judge.truth.resolve(call)
    return render_tool_call(ToolCall(name, arguments))


def test_the_environment_runs_the_ground_truth_to_reward_one_turn_by_turn():
    task = mt.tasks_of("eval", ("MathAPI",))[0]
    env = BFCLMultiTurnEnv()
    env.reset(**mt.task_row(task))
    helper = mt.Judge(task)  # only to render the calls
    total = 0.0
    for turn, truth in enumerate(task.ground_truth):
        if truth:
            obs, reward, done = env.step("\n".join(_call_text(helper, c) for c in truth))
            assert [m["role"] for m in obs] == ["tool"] * len(truth) and not done
            expected = [helper.truth.call_python(c) for c in truth]
            assert [m["content"] for m in obs] == expected
            total += reward
        obs, reward, done = env.step("Done.")
        total += reward
        if turn < len(task.turns) - 1:
            assert obs == [{"role": "user", "content": task.turns[turn + 1]}] and not done
        else:
            assert obs is None and done
        _checked_step((obs, reward, done))  # the host accepts each answer's shape
    assert total == 1.0 and all(v.valid for v in env.verdicts)


def test_a_wrong_turn_ends_the_task_and_turns_mode_keeps_the_partial_credit():
    task = next(t for t in mt.tasks_of("train", ("MathAPI",)) if len(t.turns) >= 3 and all(t.ground_truth))
    helper = mt.Judge(task)
    for mode, want in (("task", 0.0), ("turns", 1 / len(task.turns))):
        env = BFCLMultiTurnEnv(reward=mode)
        env.reset(**mt.task_row(task))
        rewards = [env.step("\n".join(_call_text(helper, c) for c in task.ground_truth[0]))[1]]
        rewards.append(env.step("Done.")[1])
        obs, reward, done = env.step("I cannot help with that.")  # turn 2 answered without its calls
        rewards.append(reward)
        assert done and obs is None
        assert sum(rewards) == pytest.approx(want)
        assert [v.valid for v in env.verdicts] == [True, False]
        assert "no call" in env.verdicts[-1].reason


def test_unparsable_calls_are_answered_and_a_bad_reward_mode_is_named():
    env = BFCLMultiTurnEnv()
    env.reset(**mt.task_row(mt.load_tasks()[0]))
    obs, reward, done = env.step('<tool_call>\n{"name": "ls", "arguments": {oops}}\n</tool_call>')
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error: could not parse tool call")
    assert not done and reward == 0.0
    with pytest.raises(ValueError, match="reward must be one of"):
        BFCLMultiTurnEnv(reward="partial")
    with pytest.raises(ValueError, match="no 'id' column"):
        BFCLMultiTurnEnv().reset(prompt="x")


@pytest.mark.parametrize("model", ["builtin", "smollm2"])
def test_observation_messages_encode_like_the_whole_conversation(model, request):
    """Token in, token out across a multi-turn task: the prompt, the sampled call, the observation's segments (tool
    results, then the user's next turn) and the next answer are the ids the template gives the whole conversation."""
    from transformers import AutoTokenizer

    from agentrl_ray.chat_format import encode_segments
    from agentrl_ray.types import TokenRole

    path = request.getfixturevalue("builtin_model_path" if model == "builtin" else "smollm2_path")
    tokenizer = AutoTokenizer.from_pretrained(path)
    task = mt.tasks_of("eval", ("MathAPI",))[0]
    row = mt.task_row(task)
    results = ['{"result": 4.0}', "Error during execution: no"]
    calls = [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 3}}},
        {"type": "function", "function": {"name": "nope", "arguments": {}}},
    ]
    observation = [*({"role": "tool", "content": r} for r in results), {"role": "user", "content": task.turns[1]}]
    messages = [
        *row["prompt"],
        {"role": "assistant", "content": "", "tool_calls": calls},
        *({"role": "tool", "content": r} for r in results),
        {"role": "user", "content": task.turns[1]},
        {"role": "assistant", "content": "Done."},
    ]
    prompt = tokenizer.apply_chat_template(
        row["prompt"], tools=row["tools"], add_generation_prompt=True, return_dict=False
    )
    sampled_text = "\n".join(
        render_tool_call(ToolCall(c["function"]["name"], c["function"]["arguments"])) for c in calls
    )
    sampled = tokenizer.encode(sampled_text + "<|im_end|>", add_special_tokens=False)
    segment_ids, roles = encode_segments(tokenizer, observation_segments(observation))
    final = tokenizer.encode("Done.<|im_end|>", add_special_tokens=False)
    whole = tokenizer.apply_chat_template(messages, tools=row["tools"], return_dict=False)
    assert list(prompt) + sampled + segment_ids + final + tokenizer.encode("\n", add_special_tokens=False) == list(
        whole
    )
    env_text = tokenizer.decode([t for t, r in zip(segment_ids, roles) if r == TokenRole.ENV])
    assert env_text == "".join(results) + task.turns[1]


def test_the_host_rejects_malformed_observation_messages():
    with pytest.raises(TypeError, match="a user message must come last"):
        _checked_step(([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], 0.0, False))
    with pytest.raises(TypeError, match=r"observation\[0\] must be"):
        _checked_step(([{"role": "system", "content": "a"}], 0.0, False))
    with pytest.raises(TypeError, match="observation must be str, a list of messages or None"):
        _checked_step(({"role": "tool"}, 0.0, False))
