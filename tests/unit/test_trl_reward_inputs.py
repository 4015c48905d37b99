"""A reward function written for TRL's tool loop scores the same trajectories the same under TRL and under ours.

The function reads what TRL 1.16's `GRPOTrainer` gives it: `completion[-1]["tool_calls"]`, structured calls with
dict arguments, `tool` messages, `completion_ids` and `trainer_state`. Both sides replay the same scripted assistant
turns (token for token) for four trajectories: one calculator call then the answer, two calls in one turn, a call
to an unknown tool (a failed call), and calls on every turn until the turn limit cuts the episode off.

- TRL: a real `GRPOTrainer(tools=[calculator])` on the built-in model (its tokenizer given TRL's Qwen2.5 template,
  which TRL knows how to parse) runs its own `_generate_and_score_completions`: prompt rendering, `parse_response`,
  `_tool_call_loop` (which runs the tool and builds the tool messages) and `_calculate_rewards`. Only its generation
  backend is replaced by the script (`_generate_single_turn`).
- Ours: `run_episodes` (the multi-turn loop of the rollout workers) with the same script as its engine and the real
  EnvHost running the calculator environment; then `rewards.score`, as the rollout worker calls it.
"""

import asyncio
import shutil

import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoConfig, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen2_5_chat_template  # noqa: E402

from agentrl_ray.config import RolloutConfig  # noqa: E402
from agentrl_ray.envs.builtin.calculator import evaluate, format_number  # noqa: E402
from agentrl_ray.envs.client import EnvClient  # noqa: E402
from agentrl_ray.envs.host import EnvHost  # noqa: E402
from agentrl_ray.rewards import score  # noqa: E402
from agentrl_ray.rewards.scoring import RewardState  # noqa: E402
from agentrl_ray.rollout.agent_loop import Episode, run_episodes  # noqa: E402
from agentrl_ray.rollout.engine import Generation  # noqa: E402
from agentrl_ray.types import RolloutTimings  # noqa: E402

END = "<|im_end|>"


def call(expression: str, name: str = "calculator") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


# (question, answer, assistant turns). Two samples per question (TRL's num_generations=2).
CASES = [
    ("What is 12 * 34?", "408", [call("12 * 34"), "The answer is 408."]),
    ("What is 12 * 34?", "408", [call("12 * 30") + "\n" + call("12 * 4"), "The answer is 360 + 48 = 408."]),
    ("What is 50 - 7?", "43", [call("50 - 7", name="abacus"), "The answer is 42."]),
    ("What is 50 - 7?", "43", [call("50 - 1"), call("49 - 6"), call("43 - 0")]),  # still calling at the limit
]
MAX_TURNS = 3  # ours: turns; TRL: max_tool_calling_iterations = MAX_TURNS - 1 tool rounds after the first turn


def calculator(expression: str) -> str:
    """
    Evaluate an arithmetic expression and return the result.

    Args:
        expression: The expression to evaluate, e.g. "(347 * 29) - 12.5".
    """
    return format_number(evaluate(expression))


def trl_style_reward(completions, answer, completion_ids, trainer_state, **kwargs):
    """Written against TRL's documented inputs only."""
    out = []
    for completion, expected, ids in zip(completions, answer, completion_ids, strict=True):
        assert ids, "every completion has token ids"  # their count differs: each side's template renders tools
        last = completion[-1]
        if last.get("tool_calls"):  # cut off while still calling tools
            out.append(-1.0)
            continue
        calls = [c for m in completion if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
        tools = [m for m in completion if m["role"] == "tool"]
        failed = sum("error" in str(m["content"]).lower() for m in tools)
        used = sum(c["function"]["name"] == "calculator" and "expression" in c["function"]["arguments"] for c in calls)
        correct = expected in last["content"]
        out.append(float(correct) + 0.25 * used - 0.5 * failed + 0.001 * (trainer_state.global_step + 1))
    return out


@pytest.fixture(scope="module")
def trl_model(builtin_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trl_model")
    shutil.copytree(builtin_model_path, folder, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = qwen2_5_chat_template  # the template TRL can parse responses of
    tok.save_pretrained(folder)
    # TRL drops a tool result that would reach the model's max positions; its template's system prompt (the tools
    # as JSON) is longer than the built-in model's compact one. Rotary positions need no weights: raise the limit.
    config = AutoConfig.from_pretrained(folder)
    config.max_position_embeddings = 4096
    config.save_pretrained(folder)
    return str(folder)


class ScriptedTurns:
    """TRL's `_generate_single_turn` replaced by the script: the case is known from its first turn's text."""

    def __init__(self, tok):
        self.tok = tok
        self.first_call = True

    def __call__(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for i, ids in enumerate(prompt_ids):
            text = self.tok.decode(ids, skip_special_tokens=False)
            if self.first_call:
                case, turn = i, 0
            else:
                case = next(k for k, c in enumerate(CASES) if c[2][0] in text)
                turn = text.count("<tool_response>") and text.count("<|im_start|>assistant") - 1
            out.append(self.tok.encode(CASES[case][2][turn] + END, add_special_tokens=False))
        self.first_call = False
        return out, None


def trl_rewards(model_dir: str, tmp_path) -> list[float]:
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=len(CASES),
        num_generations=2,
        max_completion_length=200,
        max_tool_calling_iterations=MAX_TURNS - 1,
    )
    rows = [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a, _ in CASES]
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=trl_style_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        tools=[calculator],
    )
    trainer._generate_single_turn = ScriptedTurns(tok)
    captured = {}
    original = trainer._calculate_rewards

    def capture(inputs, prompts, completions, completion_ids_list):
        captured["completions"] = completions
        rewards = original(inputs, prompts, completions, completion_ids_list)
        captured["rewards"] = rewards[:, 0].tolist()
        return rewards

    trainer._calculate_rewards = capture
    trainer._generate_and_score_completions(rows)
    return captured["rewards"], captured["completions"]


class ScriptedEngine:
    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, turns, 0

    def generate(self, prompts, max_tokens, **_):
        ids = self.tok.encode(self.turns[self.calls] + END, add_special_tokens=False)
        self.calls += 1
        return [Generation(ids, [-0.5] * len(ids), "stop") for _ in prompts]


class LocalHandle:
    """An in-process EnvHost called the way a Ray actor handle is (`.method.remote(...)` -> awaitable)."""

    def __init__(self, host):
        self.host = host

    def __getattr__(self, name):
        method = getattr(self.host, name)
        return type("M", (), {"remote": staticmethod(lambda *a, **k: method(*a, **k))})


def our_rewards(tok) -> tuple[list[float], list]:
    cfg = RolloutConfig(max_turns=MAX_TURNS, max_tokens_per_turn=100, max_total_tokens=600)

    async def one(k, question, turns):
        envs = EnvClient(
            [LocalHandle(EnvHost(tool_timeout_s=5))], "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {}
        )
        await envs.create([(f"k{k}", {})])
        prompt = [{"role": "user", "content": question}]
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        ep = Episode(f"k{k}", str(k), 0, list(ids), len(ids), prompt_messages=prompt)
        await run_episodes(
            [ep],
            ScriptedEngine(tok, turns),
            envs,
            tok,
            cfg,
            temperature=1.0,
            seed=0,
            stop_token_ids=[],
            timings=RolloutTimings(),
        )
        return ep

    episodes = [asyncio.run(one(k, q, turns)) for k, (q, _, turns) in enumerate(CASES)]
    totals, _ = score(
        [trl_style_reward],
        [1.0],
        [e.messages for e in episodes],
        {"prompt": [e.prompt_messages for e in episodes], "answer": [a for _, a, _ in CASES]},
        completion_ids=[e.ids[e.prompt_len :] for e in episodes],
        trainer_state=RewardState(global_step=0),
    )
    return totals, [e.messages for e in episodes]


def test_trl_style_reward_scores_the_same_under_trl_and_ours(trl_model, builtin_model_path, tmp_path):
    trl_scores, trl_completions = trl_rewards(trl_model, tmp_path)
    ours, our_completions = our_rewards(AutoTokenizer.from_pretrained(builtin_model_path))
    # The four behaviours score differently, so equal lists mean each trajectory was read the same way.
    assert len(set(ours)) == 4
    assert ours == pytest.approx(trl_scores)
    for theirs, mine in zip(trl_completions, our_completions, strict=True):
        assert [m["role"] for m in theirs] == [m["role"] for m in mine]
        calls = [[c["function"] for c in m.get("tool_calls") or []] for m in theirs]
        assert calls == [[c["function"] for c in m.get("tool_calls") or []] for m in mine]
