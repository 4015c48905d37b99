"""Self-play (rollout/selfplay.py): TextArena's TicTacToe (`TextArenaSelfPlay`), unchanged, through the real
EnvHost, the real pairing of the rollout worker (`_start_episodes`, `_env_rewards`) and the real loops, with a
scripted engine: one game is two trajectories, each holding only its own seat's turns, token for token what the
chat template renders of its own messages, each with its seat's reward; a seat that cannot move forfeits, a game
that fails or stalls ends both seats at once; pairing is fixed, so a batch run is reproducible."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest
from test_agent_loop import CALL, LocalHandle, ScriptedEngine

from agentrl_ray.config import ConfigError, RolloutConfig
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.rollout.agent_loop import Episode, run_episodes, run_episodes_streaming
from agentrl_ray.rollout.deadlines import Deadlines
from agentrl_ray.rollout.engine import Generation
from agentrl_ray.rollout.turn_scheduler import TurnScheduler
from agentrl_ray.rollout.worker import RolloutWorker
from agentrl_ray.types import RolloutTimings, TokenRole

pytest.importorskip("textarena")

GAME = "agentrl_ray.envs.adapters.textarena:TextArenaSelfPlay"
KWARGS = {"id": "TicTacToe-v0"}
ROW = {"id": "t1", "prompt": "Play Tic Tac Toe. Answer with your move only.", "seed": 5}
CFG = RolloutConfig(max_turns=6, max_tokens_per_turn=16, max_total_tokens=4000)


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


class SeededEngine:
    """A move chosen by each request's seed (so by its episode's key and turn): the games of a batch differ."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def generate(self, prompts, max_tokens, seeds, **_):
        return [self._move(seed) for seed in seeds]

    def _move(self, seed):
        ids = self.tok.encode(f"[{seed % 9}]<|im_end|>", add_special_tokens=False)
        return Generation(ids, [-0.25] * len(ids), "stop")


def play(tok, engine, rows, group_size=2, cfg=CFG, env=GAME, isolation="thread", timeout=30.0, stream=False):
    """Start the episodes as the rollout worker does, run them through the loop; (episodes, env rewards, host)."""
    host = EnvHost(tool_timeout_s=timeout, isolation=isolation)
    envs = EnvClient([LocalHandle(host)], env, KWARGS if env == GAME else {})
    worker = RolloutWorker.__new__(RolloutWorker)  # the worker's pairing and rewards, without an engine
    worker.index, worker.envs, worker.players, worker.tokenizer, worker.cfg, worker.tools = 0, envs, 2, tok, cfg, []
    args = dict(temperature=1.0, seed=7, stop_token_ids=[tok.eos_token_id], timings=RolloutTimings(), turn_based=True)

    async def go():
        episodes = await worker._start_episodes(rows, group_size, seed=7)
        try:
            if stream:
                await run_episodes_streaming(episodes, TurnScheduler(engine, lambda: 0), envs, tok, cfg, **args)
            else:
                await run_episodes(episodes, engine, envs, tok, cfg, version=0, **args)
            return episodes, await worker._env_rewards(episodes)
        finally:
            await envs.close([e.key for e in episodes])

    return *asyncio.run(go()), host


def moves(turns):
    return [t + "<|im_end|>" for t in turns]


def probe(turns):
    """The same game played on TextArenaSelfPlay directly: (seat 0's first observation, then (seat, observation)
    after each move, the rewards)."""
    from agentrl_ray.envs.adapters.textarena import TextArenaSelfPlay

    game = TextArenaSelfPlay(**KWARGS)
    first, answers = game.reset(**ROW), []
    for move in turns:
        seat, observation, rewards = game.step(move)
        if rewards is not None:
            return first, answers, rewards
        answers.append((seat, observation))
    raise AssertionError("the scripted game did not end")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_game_is_two_sequences_each_of_its_own_seat(tok, isolation):
    """Seat 0 takes the centre and wins on the diagonal 2-4-6: its trajectory pays 1, seat 1's -1. Each sequence
    is its own seat's prompt, moves and observations, token for token the template's rendering of its messages."""
    turns = ["[4]", "[0]", "[2]", "[1]", "[6]"]
    first, answers, rewards = probe(turns)
    (ep0, ep1), got, host = play(tok, ScriptedEngine(tok, moves(turns)), [ROW], isolation=isolation)
    assert host.stats()["created"] == 1  # one game, one environment: under seat 0's key
    assert ep0.game is ep1.game and ep0.game.key == ep0.key and (ep0.seat, ep1.seat) == (0, 1)
    assert (ep0.sample_index, ep1.sample_index) == (0, 1) and ep0.prompt_id == ep1.prompt_id == "t1"
    assert rewards == [1.0, -1.0] and got == [1.0, -1.0]
    assert ep0.finish_reason == ep1.finish_reason == "done" and (ep0.num_steps, ep1.num_steps) == (3, 2)
    for seat, ep in enumerate((ep0, ep1)):
        said = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        assert said == turns[seat::2]  # its own moves only
        seen = [obs for s, obs in answers if s == seat]
        if seat == 1:  # its first observation is its prompt's (the row's, as reset text is appended)
            assert ep.prompt_messages[-1]["content"] == ROW["prompt"] + seen.pop(0)
        else:
            assert ep.prompt_messages[-1]["content"] == ROW["prompt"] + first
        assert [m["content"] for m in ep.messages if m["role"] == "user"] == seen
        rendered = tok.apply_chat_template(ep.prompt_messages + ep.messages, tokenize=True, return_dict=False)
        assert rendered[: len(ep.ids)] == ep.ids and tok.decode(rendered[len(ep.ids) :]) == "\n"
        prompt = tok.apply_chat_template(ep.prompt_messages, add_generation_prompt=True, return_dict=False)
        assert ep.ids[: ep.prompt_len] == prompt
        action = tok.decode([t for t, r in zip(ep.ids, ep.roles) if r == TokenRole.ACTION])
        assert action == "".join(moves(turns[seat::2]))
        assert ep.logprobs[ep.prompt_len] == -0.5 and ep.turns[0].prompt == ep.ids[: ep.prompt_len]
    text0, text1 = tok.decode(ep0.ids), tok.decode(ep1.ids)
    assert "You are Player 0" in text0 and "You are Player 1" not in text0
    assert "You are Player 1" in text1 and "You are Player 0" not in text1
    assert "Player 0 placed their symbol (O) in cell 4" in ep1.prompt_messages[-1]["content"]


def test_the_stream_loop_plays_the_same_game(tok):
    turns = moves(["[4]", "[0]", "[2]", "[1]", "[6]"])
    batch, batch_rewards, _ = play(tok, ScriptedEngine(tok, turns), [ROW])
    streamed, stream_rewards, _ = play(tok, ScriptedEngine(tok, turns), [ROW], stream=True)
    assert stream_rewards == batch_rewards == [1.0, -1.0]
    for a, b in zip(batch, streamed):
        assert (a.ids, a.roles, a.messages, a.finish_reason) == (b.ids, b.roles, b.messages, b.finish_reason)


def test_invalid_moves_lose_by_the_games_rule(tok):
    """Seat 1 plays the taken centre: TextArena tells it so (a user turn of its own) and lets it retry once; the
    second invalid move loses the game."""
    (ep0, ep1), got, _ = play(tok, ScriptedEngine(tok, moves(["[4]"])), [ROW])
    assert got == [1.0, -1.0] and ep0.finish_reason == ep1.finish_reason == "done"
    assert len(ep0.turns) == 1 and len(ep1.turns) == 2  # the same seat moved twice in a row
    [retry] = [m["content"] for m in ep1.messages if m["role"] == "user"]
    assert "Player 1 attempted an invalid move" in retry and "attempted" not in tok.decode(ep0.ids)


def test_a_seat_that_cannot_move_forfeits(tok):
    """Cut by its token budget, or out of turns while the game waits for it: the seat forfeits (TextArena's score
    of a losing invalid move, -1) and the opponent, its move still to come or not, wins 1."""
    long_move = "I will think about it at length before I choose a cell " * 3
    (ep0, ep1), got, _ = play(tok, ScriptedEngine(tok, moves(["[4]", long_move])), [ROW])
    assert ep1.finish_reason == "length" and ep0.finish_reason == "done" and got == [1.0, -1.0]
    # One turn each: seat 0 moves, seat 1 moves, and the game waits for seat 0, who has none left.
    cfg = RolloutConfig(max_turns=1, max_tokens_per_turn=16, max_total_tokens=4000)
    (ep0, ep1), got, _ = play(tok, ScriptedEngine(tok, moves(["[4]", "[0]"])), [ROW], cfg=cfg)
    assert (ep0.finish_reason, ep1.finish_reason) == ("max_turns", "done") and got == [-1.0, 1.0]
    # Seat 0 cut on its first move: seat 1 never saw the game; its trajectory is the row's prompt alone.
    (ep0, ep1), got, _ = play(tok, ScriptedEngine(tok, moves([long_move])), [ROW])
    assert (ep0.finish_reason, ep1.finish_reason) == ("length", "done") and got == [-1.0, 1.0]
    alone = [{"role": "user", "content": ROW["prompt"]}]
    assert ep1.turns == [] and ep1.ids == tok.apply_chat_template(alone, add_generation_prompt=True, return_dict=False)


class BrokenGame:
    """A game of two players whose second move stalls past the deadline, raises, or is answered wrongly."""

    players = 2

    def reset(self, **row):
        self.how, self.moves = row["how"], 0
        return "Your move."

    def step(self, text):
        self.moves += 1
        if self.moves == 1:
            return 1, "Your move.", None
        if self.how == "stall":
            time.sleep(3.0)
        if self.how == "raise":
            raise RuntimeError("the game crashed")
        return 0, "Your move.", [1.0]  # one reward for two seats


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("how", ["stall", "raise", "bad"])
def test_a_game_that_fails_or_stalls_ends_both_seats(tok, how, stream):
    """The second move's step passes its 0.3 s deadline, raises or breaks the contract: the game's state is
    unknown, so both seats end with "error" and no reward (None: `env_reward` scores 0), the mover's step counted
    as failed; the waiting seat does not hang."""
    rows = [{"id": "b", "prompt": "Play.", "how": how}]
    t0 = time.perf_counter()
    (ep0, ep1), got, host = play(
        tok, ScriptedEngine(tok, moves(["x"])), rows, env=f"{__name__}:BrokenGame", timeout=0.3, stream=stream
    )
    assert time.perf_counter() - t0 < 2.5  # the stalled step is not waited for
    assert ep0.finish_reason == ep1.finish_reason == "error" and got == [None, None]
    assert (ep0.num_step_errors, ep1.num_step_errors) == (0, 1) and host.stats()["timeouts"] == (how == "stall")


def test_pairing_is_fixed_and_a_batch_run_is_reproducible(tok):
    """Two rows, four samples each: samples 2i and 2i+1 of a group play game i, seat by parity, one environment per
    game; moves drawn from each episode's seeds make different games, the same ones on every run."""
    rows = [ROW, {**ROW, "id": "t2", "seed": 6}]
    first = play(tok, SeededEngine(tok), rows, group_size=4)
    again = play(tok, SeededEngine(tok), rows, group_size=4)
    episodes, rewards, host = first
    assert host.stats()["created"] == 4 and len(episodes) == 8
    for i, ep in enumerate(episodes):
        assert ep.sample_index == i % 4 and ep.seat == i % 2 and ep.game is episodes[i - i % 2].game
        assert ep.game.key == episodes[i - i % 2].key and ep.prompt_id == rows[i // 4]["id"]
    assert [e.ids for e in episodes] == [e.ids for e in again[0]] and rewards == again[1]
    assert len({tuple(e.ids) for e in episodes[::2]}) > 1  # the games differ
    for i in range(0, 8, 2):  # zero-sum: a win against a loss, or a draw
        assert rewards[i] + rewards[i + 1] == 0 and rewards[i] in (-1.0, 0.0, 1.0)


def test_a_game_needs_an_even_group_and_its_deadlines_double(tok):
    from agentrl_ray.envs.adapters.textarena import TextArenaSelfPlay
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.run.preflight import check_players

    cfg = load_config(overrides=[f"env.name={GAME}", "env.kwargs.id=TicTacToe-v0", "rollout.group_size=3"])
    with pytest.raises(ConfigError, match=r"^rollout.group_size=3 must be even: .* game of two players"):
        check_players(TextArenaSelfPlay, cfg)
    cfg = load_config(overrides=[f"env.name={GAME}", "rollout.group_size=4", "run.eval_samples=1"])
    with pytest.raises(ConfigError, match=r"^run.eval_samples=1 must be even"):
        check_players(TextArenaSelfPlay, cfg)
    one, two = Deadlines.of(cfg), Deadlines.of(cfg, players=2)
    assert two.max_turns == 2 * one.max_turns and two.turn_s == one.turn_s + cfg.env.tool_timeout_s
    with pytest.raises(ValueError, match="pairs the samples of a group: 3 samples is odd"):
        play(tok, ScriptedEngine(tok, moves(["[4]"])), [ROW], group_size=3)


class RecordingEngine(ScriptedEngine):
    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.seeds = []

    def generate(self, prompts, max_tokens, seeds, **kw):
        self.seeds.append(list(seeds))
        return super().generate(prompts, max_tokens, **kw)


def test_runs_without_games_keep_their_batches_and_seeds(tok):
    """The batch loop now counts each episode's own turns: without games every live episode still goes into every
    engine call, with the seed of (run seed, its key, the turn), as before (what a bit-identical resume relies on)."""
    host = EnvHost(tool_timeout_s=5)
    envs = EnvClient([LocalHandle(host)], "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {})
    prompt = tok.encode("<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")
    engine = RecordingEngine(tok, [CALL])  # a tool call every turn: each episode runs out of turns
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_total_tokens=600)

    async def go():
        episodes = [Episode(f"k{i}", "p", i, list(prompt), len(prompt)) for i in range(3)]
        await envs.create([(e.key, {}) for e in episodes])
        args = dict(temperature=1.0, seed=7, stop_token_ids=[tok.eos_token_id], timings=RolloutTimings())
        await run_episodes(episodes, engine, envs, tok, cfg, **args)
        return episodes

    episodes = asyncio.run(go())
    assert all(e.finish_reason == "max_turns" and len(e.turns) == 3 for e in episodes)
    assert engine.seeds == [[zlib.crc32(f"7/k{i}/{turn}".encode()) for i in range(3)] for turn in range(3)]
