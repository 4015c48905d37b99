"""The multi-turn loop with turn-based environments (`step(text) -> (observation, reward, done)`): ids are exactly
prompt + sampled + encoded user-turn segments, each tagged with its role, and the episode ends for the right reason.

As in test_agent_loop (whose scripted engine and local env-host handle this reuses): the engine replays fixed turns,
the environment is the real EnvHost with the real ScriptedUserEnv, called in-process, no Ray.
"""

import asyncio

import pytest
from test_agent_loop import LocalHandle, ScriptedEngine

from agentrl_ray.chat_format import encode_segments, user_turn_segments
from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.rollout.agent_loop import Episode, run_episodes
from agentrl_ray.types import RolloutTimings, TokenRole

SCRIPTED = "examples.conversation.env:ScriptedUserEnv"
# Three assistant turns: the first must greet, the second anything, the third must name Paris.
ROW = {"expected": ["hello", None, "paris"], "user_turns": ["Tell me something.", "Capital of France?"]}
PROMPT_TEXT = "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"


class QuietOrFailingEnv:
    """Says nothing (observation None) and never ends, or fails on its first step, as the row asks."""

    def reset(self, **row):
        self.fail = row["fail"]

    def step(self, text):
        if self.fail:
            raise RuntimeError("the simulator crashed")
        return None, 0.25, False


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


def run_turn_based(
    tok, turns, cfg, env_path=SCRIPTED, row=ROW, isolation="thread", prompt_text=PROMPT_TEXT, env_kwargs=None
):
    """One episode of the scripted `turns` against the real EnvHost (in-process) holding `env_path` for `row`:
    (prompt ids, the episode, the environment's reward). Also used by test_env_adapters.py."""
    host = EnvHost(tool_timeout_s=30, isolation=isolation)
    prompt = tok.encode(prompt_text, add_special_tokens=False)

    async def go():
        envs = EnvClient([LocalHandle(host)], env_path, env_kwargs or {})
        await envs.create([("k", row)])
        ep = Episode("k", "p", 0, list(prompt), prompt_len=len(prompt))
        await run_episodes(
            [ep],
            ScriptedEngine(tok, turns),
            envs,
            tok,
            cfg,
            temperature=1.0,
            seed=0,
            stop_token_ids=[tok.eos_token_id],
            timings=RolloutTimings(),
            turn_based=True,
        )
        reward = await host.env_reward("k", ep.messages[-1]["content"])
        await envs.close(["k"])
        return ep, reward

    return prompt, *asyncio.run(go())


def test_observations_become_user_turns_with_exact_tokens_and_roles(tok):
    turns = ["Hello there!<|im_end|>", "The sky is blue.<|im_end|>", "It is Lyon.<|im_end|>"]
    cfg = RolloutConfig(max_turns=5, max_tokens_per_turn=64, max_total_tokens=400)
    prompt, ep, reward = run_turn_based(tok, turns, cfg)
    sampled = [tok.encode(t, add_special_tokens=False) for t in turns]
    obs = [encode_segments(tok, user_turn_segments(u)) for u in ROW["user_turns"]]
    assert ep.ids == prompt + sampled[0] + obs[0][0] + sampled[1] + obs[1][0] + sampled[2]

    assert ep.roles == (
        [TokenRole.PROMPT] * len(prompt)
        + [TokenRole.ACTION] * len(sampled[0])
        + obs[0][1]
        + [TokenRole.ACTION] * len(sampled[1])
        + obs[1][1]
        + [TokenRole.ACTION] * len(sampled[2])
    )
    assert tok.decode([i for i, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV]) == "".join(ROW["user_turns"])
    assert ep.finish_reason == "done"
    assert [m["role"] for m in ep.messages] == ["assistant", "user", "assistant", "user", "assistant"]
    assert ep.messages[1]["content"] == "Tell me something." and ep.messages[-1]["content"] == "It is Lyon."
    assert ep.num_steps == 3 and ep.num_step_errors == 0 and ep.num_tool_calls == 0  # one `step` per turn
    assert reward == 2 / 3  # sum of the steps: 1/3 (greets) + 1/3 (anything goes) + 0 (Lyon is not Paris)
    after_obs = len(prompt) + len(sampled[0]) + len(obs[0][0])
    assert ep.logprobs[after_obs - 1] == 0.0 and ep.logprobs[after_obs] == -0.5


def test_budgets_end_turn_based_episodes(tok):
    turns = ["Hello there!<|im_end|>"]
    # The environment still wants a third turn: every turn was shown to it, the last one's reward counts.
    _, ep, reward = run_turn_based(tok, turns, RolloutConfig(max_turns=2, max_tokens_per_turn=64, max_total_tokens=400))
    assert ep.finish_reason == "max_turns" and ep.num_steps == 2
    assert [m["role"] for m in ep.messages] == ["assistant", "user", "assistant"]
    assert reward == 2 / 3
    # A turn cut by the per-turn budget is never sent to the environment.
    _, ep, reward = run_turn_based(tok, turns, RolloutConfig(max_turns=2, max_tokens_per_turn=3, max_total_tokens=400))
    assert ep.finish_reason == "length" and ep.num_steps == 0 and ep.roles.count(TokenRole.ACTION) == 3
    assert reward is None  # no step ran: the environment has no reward to give
    # No room for the observation and one more token.
    n_prompt = len(tok.encode(PROMPT_TEXT, add_special_tokens=False))
    n_turn = len(tok.encode(turns[0], add_special_tokens=False))
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=n_turn, max_total_tokens=n_prompt + n_turn + 5)
    _, ep, _ = run_turn_based(tok, turns, cfg)
    assert ep.finish_reason == "length" and ep.num_steps == 1 and ep.roles.count(TokenRole.ENV) == 0
    assert [m["role"] for m in ep.messages] == ["assistant"]


def test_silent_observation_and_failing_step(tok):
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_total_tokens=400)
    path = f"{__name__}:QuietOrFailingEnv"
    # Observation None: an empty user turn (template tokens only), and the episode goes on.
    prompt, ep, reward = run_turn_based(tok, ["Hi.<|im_end|>"], cfg, path, {"fail": False})
    turn = tok.encode("Hi.<|im_end|>", add_special_tokens=False)
    empty_user = encode_segments(tok, user_turn_segments(""))[0]
    assert ep.ids == prompt + (turn + empty_user) * 2 + turn
    assert ep.roles.count(TokenRole.ENV) == 0 and ep.finish_reason == "max_turns" and reward == 0.75
    # A failing step ends the episode and counts as a tool error; the conversation still ends with the assistant.
    _, ep, reward = run_turn_based(tok, ["Hi.<|im_end|>"], cfg, path, {"fail": True})
    assert ep.finish_reason == "error" and (ep.num_steps, ep.num_step_errors) == (1, 1)
    assert [m["role"] for m in ep.messages] == ["assistant"] and reward is None


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_multi_turn_task_with_tools_runs_through_the_loop(tok, isolation):
    """BFCL's multi-turn environment (examples/bfcl/multi_turn.py): tool results come back as tool messages (ENV
    tokens, with their calls' ids), the user's next turn as a user turn, and the ground truth earns reward 1.0;
    at `process` isolation the observation's messages cross the child's JSON pipe."""
    pytest.importorskip("bfcl_eval")
    from agentrl_ray.chat_format import ToolCall, observation_segments, render_tool_call
    from agentrl_ray.tasks.bfcl import multi_turn as mt

    task = next(t for t in mt.tasks_of("train", ("MathAPI",)) if len(t.turns) == 2 and all(t.ground_truth))
    world = mt.World(task)
    calls = [[world.resolve(c) for c in truth] for truth in task.ground_truth]
    results = [[world.call_python(c) for c in truth] for truth in task.ground_truth]
    turns = []
    for turn_calls in calls:
        turns.append("\n".join(render_tool_call(ToolCall(n, a)) for n, a in turn_calls) + "<|im_end|>")
        turns.append("Done.<|im_end|>")
    cfg = RolloutConfig(max_turns=6, max_tokens_per_turn=400, max_total_tokens=4000)
    env = "examples.bfcl.multi_turn:BFCLMultiTurnEnv"
    prompt, ep, reward = run_turn_based(tok, turns, cfg, env, mt.task_row(task), isolation)
    assert (ep.finish_reason, reward, ep.num_steps) == ("done", 1.0, 4)
    sampled = [tok.encode(t, add_special_tokens=False) for t in turns]
    tools0 = encode_segments(tok, observation_segments([{"role": "tool", "content": r} for r in results[0]]))
    user1 = encode_segments(tok, observation_segments([{"role": "user", "content": task.turns[1]}]))
    tools1 = encode_segments(tok, observation_segments([{"role": "tool", "content": r} for r in results[1]]))
    assert ep.ids == prompt + sampled[0] + tools0[0] + sampled[1] + user1[0] + sampled[2] + tools1[0] + sampled[3]
    env_ids = [t for t, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV]
    assert tok.decode(env_ids) == "".join(results[0]) + task.turns[1] + "".join(results[1])
    roles = [m["role"] for m in ep.messages]
    assert roles == ["assistant", *["tool"] * len(results[0]), "assistant", "user"] + [
        "assistant",
        *["tool"] * len(results[1]),
        "assistant",
    ]
    first = ep.messages[0]
    assert [c["function"]["name"] for c in first["tool_calls"]] == [n for n, _ in calls[0]]
    assert ep.messages[1]["tool_call_id"] == first["tool_calls"][0]["id"]
