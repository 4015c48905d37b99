"""Environments of other libraries behind our contract (agentrl_ray/envs/adapters/): SkyRL Gym's own environments and
TextArena's own games, unchanged, through the real EnvHost (in-process and in env children) and the real multi-turn
loop."""

from __future__ import annotations

import sys

import pytest
from test_agent_loop_turns import run_turn_based

from agentrl_ray.chat_format import encode_segments, observation_segments
from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.adapters.skyrl_gym import SkyRLGymEnv
from agentrl_ray.types import TokenRole

skyrl_gym = pytest.importorskip("skyrl_gym")

ADAPTER = "agentrl_ray.envs.adapters.skyrl_gym:SkyRLGymEnv"
# A row as SkyRL's gsm8k datasets hold it.
ROW = {
    "id": "q0",
    "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
    "env_class": "gsm8k_multi_turn",
    "reward_spec": {"method": "rule", "ground_truth": "42"},
    "extra_info": {"max_turns": 3},
}
PROMPT_TEXT = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_skyrl_gsm8k_multi_turn_runs_unchanged_through_the_loop(tok, isolation):
    """SkyRL's gsm8k_multi_turn: a wrong answer earns its format score and its next user turn (environment tokens),
    the right one 1.0 and the end; the episode's reward is the sum of the turns'."""
    turns = ["I think 41. #### 41<|im_end|>", "#### 42<|im_end|>"]
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=64, max_total_tokens=600)
    # no env.kwargs.id: the row's env_class names it, as in SkyRL
    prompt, ep, reward = run_turn_based(tok, turns, cfg, ADAPTER, ROW, isolation, PROMPT_TEXT)
    # SkyRL's own numbers: 1.0 for the right answer, 0.2 / max_turns for a well-formatted wrong one
    assert ep.finish_reason == "done" and reward == pytest.approx(1.0 + 0.2 / 3)
    follow_up = skyrl_gym.make("gsm8k_multi_turn", env_config={}, extras=ROW)
    follow_up.init(ROW["prompt"])
    [expected] = follow_up.step("I think 41. #### 41")["observations"]
    sampled = [tok.encode(t, add_special_tokens=False) for t in turns]
    observation = encode_segments(tok, observation_segments([{"role": "user", "content": expected["content"]}]))
    assert ep.ids == prompt + sampled[0] + observation[0] + sampled[1]
    env_text = tok.decode([t for t, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV])
    assert env_text == expected["content"]
    assert [m["role"] for m in ep.messages] == ["assistant", "user", "assistant"]


def _register(name: str, init, step) -> None:
    class Probe(skyrl_gym.Env):
        def __init__(self, env_config=None, extras=None):
            self.extras = extras

        def init(self, prompt):
            return init(prompt), {}

        def step(self, action):
            return step(action)

    if name not in skyrl_gym.registry:
        skyrl_gym.register(id=name, entry_point=Probe)


def test_init_may_append_to_the_prompt_but_not_rewrite_it():
    def appended(prompt):
        return [*prompt[:-1], {"role": "user", "content": prompt[-1]["content"] + " Think step by step."}]

    _register("agentrl-appends", appended, lambda a: {"observations": [], "reward": 0.0, "done": True})
    _register("agentrl-rewrites", lambda p: [{"role": "system", "content": "x"}, *p], lambda a: {})
    env = SkyRLGymEnv(id="agentrl-appends")
    assert env.reset(**ROW) == " Think step by step."
    with pytest.raises(ValueError, match="rewrites the prompt"):
        SkyRLGymEnv(id="agentrl-rewrites").reset(**ROW)


def test_observations_map_to_tool_results_then_one_user_turn():
    def step(action):
        return {
            "observations": [
                {"role": "tool", "content": "r1"},
                {"role": "user", "content": "a"},
                {"role": "tool", "content": "r2"},
                {"role": "user", "content": "b"},
            ],
            "reward": 0.5,
            "done": False,
            "metadata": {},
            "postprocessed_action": "ignored",
        }

    _register("agentrl-tools", lambda p: p, step)
    env = SkyRLGymEnv(id="agentrl-tools")
    assert env.reset(**ROW) is None
    obs, reward, done = env.step("call")
    assert obs == [
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "user", "content": "a\n\nb"},
    ]
    assert (reward, done) == (0.5, False)
    _register("agentrl-bad-role", lambda p: p, lambda a: {"observations": [{"role": "assistant"}], "reward": 0})
    bad = SkyRLGymEnv(id="agentrl-bad-role")
    bad.reset(**ROW)
    with pytest.raises(ValueError, match="observation\\[0\\] has role 'assistant'"):
        bad.step("x")


def test_errors_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="not a registered skyrl-gym environment"):
        SkyRLGymEnv(id="no-such-env").reset(**ROW)
    with pytest.raises(ValueError, match="no environment id"):
        SkyRLGymEnv().reset(**{k: v for k, v in ROW.items() if k != "env_class"})
    with pytest.raises(RuntimeError, match="step before reset"):
        SkyRLGymEnv(id="gsm8k").step("x")
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'agentrl_ray\[envs\]'"):
        SkyRLGymEnv(id="gsm8k")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_textarena_game_plays_through_the_loop_and_pays_its_win(tok, isolation):
    """TextArena's GuessTheNumber from its raw registration: each guess is a turn, the game's hints are the next user
    turns (environment tokens, without the echo of the guess), and the win is the episode's reward."""
    from agentrl_ray.envs.adapters.textarena import TextArenaEnv

    row = {"id": "g1", "prompt": "Play."}
    probe = TextArenaEnv("GuessTheNumber-v0")
    probe.reset(**row)
    guesses, hints, lo, hi = [], [], 1, 20
    while True:  # binary search on the game itself: the turns a player that reads the hints would take
        guesses.append(f"My guess is [{(lo + hi) // 2}].")
        hint, reward, done = probe.step(guesses[-1])
        if done:
            break
        hints.append(hint)
        lo, hi = ((lo + hi) // 2 + 1, hi) if "higher" in hint else (lo, (lo + hi) // 2 - 1)
    assert reward == 1.0 and len(guesses) >= 2 and all("[" not in h for h in hints)
    turns = [g + "<|im_end|>" for g in guesses]
    cfg = RolloutConfig(max_turns=12, max_tokens_per_turn=32, max_total_tokens=800)
    adapter = "agentrl_ray.envs.adapters.textarena:TextArenaEnv"
    prompt, ep, got = run_turn_based(
        tok, turns, cfg, adapter, row, isolation, PROMPT_TEXT, env_kwargs={"id": "GuessTheNumber-v0"}
    )
    assert ep.finish_reason == "done" and got == 1.0
    assert [m["role"] for m in ep.messages] == ["assistant", "user"] * len(hints) + ["assistant"]
    assert [m["content"] for m in ep.messages if m["role"] == "user"] == hints
    env_text = tok.decode([t for t, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV])
    assert all(h in env_text for h in hints)


def test_textarena_refuses_what_it_cannot_play():
    from agentrl_ray.envs.adapters.textarena import TextArenaEnv, TextArenaSelfPlay

    with pytest.raises(ValueError, match="not a registered TextArena game"):
        TextArenaEnv("NoSuchGame-v0")
    with pytest.raises(ValueError, match="not a single-player game: play it by self-play with env.name=.*SelfPlay"):
        TextArenaEnv("TicTacToe-v0").reset(id="x")
    with pytest.raises(ValueError, match="GuessTheNumber-v0 is not a two-player game"):
        TextArenaSelfPlay("GuessTheNumber-v0").reset(id="x")


GEM_ADAPTER = "agentrl_ray.envs.adapters.gem:GEMEnv"


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_gem_game_plays_through_the_loop_and_pays_its_rewards(tok, isolation):
    """GEM's GuessTheNumber: each guess is a turn, the game's hint with GEM's suffix is the next user turn
    (environment tokens), and the episode's reward is the sum of GEM's step rewards."""
    from agentrl_ray.envs.adapters.gem import GEMEnv

    row = {"id": "g1", "prompt": "Play.", "seed": 11}
    probe = GEMEnv("game:GuessTheNumber-v0-easy")
    rules = probe.reset(**row)
    guesses, hints, rewards, lo, hi = [], [], [], 1, 10
    while True:  # binary search on the game itself
        guesses.append(f"I guess \\boxed{{{(lo + hi) // 2}}}.")
        hint, reward, done = probe.step(guesses[-1])
        rewards.append(reward)
        if done:
            break
        hints.append(hint)
        lo, hi = ((lo + hi) // 2 + 1, hi) if "higher" in hint else (lo, (lo + hi) // 2 - 1)
    assert "Guess The Number" in rules and len(guesses) >= 2 and rewards[-1] == 1.0
    assert all(h.endswith("Enter your next guess.") for h in hints)
    turns = [g + "<|im_end|>" for g in guesses]
    cfg = RolloutConfig(max_turns=8, max_tokens_per_turn=32, max_total_tokens=900)
    prompt, ep, got = run_turn_based(
        tok, turns, cfg, GEM_ADAPTER, row, isolation, PROMPT_TEXT, env_kwargs={"id": "game:GuessTheNumber-v0-easy"}
    )
    assert ep.finish_reason == "done" and got == pytest.approx(sum(rewards))
    assert [m["content"] for m in ep.messages if m["role"] == "user"] == hints
    env_text = tok.decode([t for t, r in zip(ep.ids, ep.roles) if r == TokenRole.ENV])
    assert all(h in env_text for h in hints)


def test_gems_python_tool_runs_a_block_and_the_answer_is_scored():
    """gem's ToolEnvWrapper with its PythonCodeTool around a reasoning-gym task: a `<python>` block runs and its
    output is the next user turn; the boxed answer is scored by reasoning-gym (1.0 right, 0.0 wrong)."""
    from agentrl_ray.envs.adapters.gem import GEMEnv

    env = GEMEnv("rg:basic_arithmetic", tools=["python"], max_tool_uses=2)
    question = env.reset(id="q", seed=5)
    expression = question.splitlines()[0].removeprefix("Calculate ").rstrip(".").replace("= ?", "").strip()
    assert "<python>" in question  # the tool's instructions follow the question
    output, reward, done = env.step(f"<python>print({expression})</python>")
    assert not done and reward == 0.0 and str(eval(expression)) in output  # noqa: S307 - the task's own arithmetic
    for answer, expected in ((eval(expression), 1.0), (eval(expression) + 1, 0.0)):  # noqa: S307
        env.reset(id="q", seed=5)
        assert env.step(f"The answer is \\boxed{{{answer}}}") == (None, expected, True)


def test_gem_refuses_what_it_cannot_make(monkeypatch):
    from agentrl_ray.envs.adapters.gem import GEMEnv

    with pytest.raises(ValueError, match="not a registered GEM environment"):
        GEMEnv("game:NoSuchGame-v0")
    with pytest.raises(ValueError, match="unknown tools"):
        GEMEnv("rg:basic_arithmetic", tools=["search"])
    monkeypatch.setitem(sys.modules, "gem", None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gem-llm==0.1.0"):
        GEMEnv("rg:basic_arithmetic")
