"""The multi-turn loop, tokens in and tokens out, for tool environments and turn-based environments.

One `Episode` per trajectory. Every turn, all live episodes are generated together (one batched engine call, so
the engine sees the whole batch), then each talks to its own environment instance, concurrently (the streaming
pipeline's `run_episodes_streaming` drops that turn barrier: each episode at its own pace, `turn_scheduler.py`):
- a tool environment runs the turn's tool calls; the tokenized tool results are appended with role tags;
- a turn-based environment (one with `step`, see `envs.base`) gets the whole assistant turn through `call_turn`;
  its observation is appended as the next user message (`ToolFormat.user_turn_segments`).
The conversation is never re-tokenized: the learner trains on exactly the ids the engine sampled, and the rollout
logprobs line up with them one to one. Each engine call is recorded as a `continuity.Turn` (the prompt it was given,
what it sampled), which the worker checks against the assembled trajectory (`rollout/continuity.py`).

A tool episode ends with
- "answer": the policy produced a turn without tool calls (its final answer);
- "length": the token budget ran out (mid-turn, or no room for the tool result and another turn);
- "max_turns": the policy still asked for tools after `max_turns` turns.
A turn-based episode ends with "done" (the environment said so), "length", "max_turns" (the environment still
wanted more after `max_turns` turns, every one of which it was shown) or "error" (its `step` failed: the env host
ends the episode, and the failure counts as a tool error).

Self-play (an environment with `players = 2`, `rollout/selfplay.py`): two episodes play one game, and only the one
the game waits for takes a turn. The batch loop generates, each turn, the live episodes that are not waiting for
their opponent (a waiting one is not done; without games that is every live episode, as before: the seeds, batches
and environment calls of other runs are unchanged); its moves go to the game's environment, whose answer hands the
turn to a seat (its observation appended to that seat's sequence) or ends the game for both. The stream loop plays
each game as one task.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.chat_format import Segment, encode_segments
from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.messages import assistant_message, tool_messages
from agentrl_ray.rollout.continuity import Turn
from agentrl_ray.rollout.engine import Engine
from agentrl_ray.rollout.selfplay import Game
from agentrl_ray.rollout.tool_format import HERMES, ToolFormat
from agentrl_ray.rollout.turn_scheduler import TurnScheduler
from agentrl_ray.types import RolloutTimings, TokenRole

logger = logging.getLogger(__name__)


@dataclass
class Episode:
    key: str  # trajectory key, also the key of its environment instance
    prompt_id: str
    sample_index: int
    ids: list[int]
    prompt_len: int
    roles: list[TokenRole] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the completion as structured messages (messages.py)
    finish_reason: str = ""
    num_tool_calls: int = 0  # tool calls, well-formed or not
    num_tool_errors: int = 0  # tool calls that failed (the observation is an error)
    num_steps: int = 0  # turn-based environments: `step` calls
    num_step_errors: int = 0  # `step` calls that failed (the episode then ends with "error")
    prompt_messages: list[dict[str, Any]] = field(default_factory=list)  # as rendered for the engine
    turns: list[Turn] = field(default_factory=list)  # every engine call, as the engine saw and answered it
    game: Game | None = None  # self-play: the game this episode is a seat of (rollout/selfplay.py)
    seat: int = 0
    # A seat that has not seen its game yet (ids empty): renders its prompt, the row's with its first observation.
    render: Callable[[str | None], tuple[list[int], list[dict[str, Any]]]] | None = None

    def __post_init__(self) -> None:
        self.roles = [TokenRole.PROMPT] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)

    def begin(self, observation: str | None) -> None:
        """Take the prompt `render` makes of this seat's first observation (None: the row's prompt alone)."""
        ids, self.prompt_messages = self.render(observation)
        self.ids, self.prompt_len, self.render = list(ids), len(ids), None
        self.__post_init__()

    def append(self, ids: list[int], role: TokenRole, logprobs: list[float] | None = None) -> None:
        self.ids.extend(ids)
        self.roles.extend([role] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


async def run_episodes(
    episodes: list[Episode],
    engine: Engine,
    envs: EnvClient,
    tokenizer,
    cfg: RolloutConfig,
    *,
    temperature: float,
    seed: int,
    stop_token_ids: list[int],
    timings: RolloutTimings,
    turn_based: bool = False,
    version: int = -1,
    fmt: ToolFormat = HERMES,
) -> None:
    """Run every episode to its end, in place. `turn_based`: the environments define `step` instead of tools;
    `version`: the weights version the engine holds (recorded with each turn); `fmt`: the model's tool-call
    format (`rollout/tool_format.py`)."""
    games = list(dict.fromkeys(e.game for e in episodes if e.game is not None))
    while live := [e for e in episodes if _ready(e, cfg)]:
        t0 = time.perf_counter()
        turns = [len(e.turns) for e in live]  # each episode's own turn index (a waiting seat skips engine calls)
        budgets = [min(cfg.max_tokens_per_turn, cfg.max_total_tokens - len(e.ids)) for e in live]
        prompts = [list(e.ids) for e in live]  # what the engine is given, kept for the continuity check
        gens = engine.generate(
            prompts,
            budgets,
            temperature=temperature,
            top_p=cfg.top_p,
            stop_token_ids=stop_token_ids,
            seeds=[_turn_seed(seed, e, turn) for e, turn in zip(live, turns)],
        )
        timings.generate_s += time.perf_counter() - t0

        lasts = [turn == cfg.max_turns - 1 for turn in turns]
        taken = [
            _take_turn(ep, p, g, version, turn, last, tokenizer, turn_based, fmt)
            for ep, p, g, turn, last in zip(live, prompts, gens, turns, lasts)
        ]
        pending = [(ep, request, last) for ep, request, last in zip(live, taken, lasts) if request is not None]
        t0 = time.perf_counter()
        requests = [request for _, request, _ in pending]
        results = await (envs.call_turns(requests) if turn_based else envs.call_tools(requests))
        timings.env_s += time.perf_counter() - t0
        for (ep, _, last), result in zip(pending, results):
            _after_env(ep, result, last, tokenizer, cfg, turn_based, fmt)
        if games:
            t0 = time.perf_counter()
            await _forfeit(games, envs)
            timings.env_s += time.perf_counter() - t0
    for ep in episodes:
        if not ep.done:
            ep.finish_reason = "max_turns"


def _ready(ep: Episode, cfg: RolloutConfig) -> bool:
    """Whether `ep` takes a turn now: live, with turns left, and not waiting for its opponent's move."""
    return not ep.done and len(ep.turns) < cfg.max_turns and (ep.game is None or ep.game.mover is ep)


async def run_episodes_streaming(
    episodes: list[Episode],
    scheduler: TurnScheduler,
    envs: EnvClient,
    tokenizer,
    cfg: RolloutConfig,
    *,
    temperature: float,
    seed: int,
    stop_token_ids: list[int],
    timings: RolloutTimings,
    turn_based: bool = False,
    fmt: ToolFormat = HERMES,
) -> None:
    """`run_episodes` without the turn barrier (the streaming pipeline): each episode goes at its own pace, its
    turns batched by `scheduler` with whatever other episodes (of this call or others) wait for the engine then.
    Each turn records the weights version that sampled it. `timings`: generate_s and env_s are each episode's
    seconds waiting for the engine and for its environment, the mean over episodes."""

    async def turn(ep: Episode) -> None:
        n = len(ep.turns)
        last_turn = n == cfg.max_turns - 1
        prompt = list(ep.ids)
        t0 = time.perf_counter()
        gen, version = await scheduler.generate(
            prompt,
            min(cfg.max_tokens_per_turn, cfg.max_total_tokens - len(ep.ids)),
            temperature=temperature,
            top_p=cfg.top_p,
            stop_token_ids=stop_token_ids,
            seed=_turn_seed(seed, ep, n),
        )
        t1 = time.perf_counter()
        timings.generate_s += (t1 - t0) / len(episodes)
        request = _take_turn(ep, prompt, gen, version, n, last_turn, tokenizer, turn_based, fmt)
        if request is None:
            return
        results = await (envs.call_turns([request]) if turn_based else envs.call_tools([request]))
        timings.env_s += (time.perf_counter() - t1) / len(episodes)
        _after_env(ep, results[0], last_turn, tokenizer, cfg, turn_based, fmt)

    async def one(ep: Episode) -> None:
        while _ready(ep, cfg):
            await turn(ep)
        if not ep.done:
            ep.finish_reason = "max_turns"

    async def play(game: Game) -> None:  # its seats' turns, in the order the game asks for them
        while (ep := game.mover) is not None:
            if _ready(ep, cfg):
                await turn(ep)
            elif not ep.done:
                ep.finish_reason = "max_turns"
            await _forfeit([game], envs)

    games = dict.fromkeys(e.game for e in episodes if e.game is not None)
    await asyncio.gather(*(one(ep) for ep in episodes if ep.game is None), *(play(g) for g in games))


def _turn_seed(seed: int, ep: Episode, turn: int) -> int:
    return zlib.crc32(f"{seed}/{ep.key}/{turn}".encode())


def _take_turn(
    ep: Episode,
    prompt: list[int],
    gen,
    version: int,
    turn: int,
    last_turn: bool,
    tokenizer,
    turn_based: bool,
    fmt: ToolFormat,
) -> tuple | None:
    """Append one generated turn to `ep`; returns its request to the environment, or None (and a finish reason)."""
    ep.turns.append(Turn(prompt, list(gen.token_ids), list(gen.logprobs), version))
    ep.append(gen.token_ids, TokenRole.ACTION, gen.logprobs)
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=False)
    text = text.removesuffix(tokenizer.eos_token or "")
    if turn_based:
        ep.messages.append({"role": "assistant", "content": text})
    else:
        ep.messages.append(assistant_message(text, fmt.parse(text), turn))
    if gen.finish_reason == "length":
        ep.finish_reason = "length"
        return None
    if turn_based:
        # Even on the last turn: the environment scores every reply, the last one included.
        ep.num_steps += 1
        return (ep.game.key if ep.game is not None else ep.key, text)
    return _tool_request(ep, text, last_turn, fmt)


def _after_env(
    ep: Episode, result, last_turn: bool, tokenizer, cfg: RolloutConfig, turn_based: bool, fmt: ToolFormat
) -> None:
    if ep.game is not None:
        _after_move(ep, result, tokenizer, cfg, fmt)
    elif turn_based:
        _after_step(ep, result, last_turn, tokenizer, cfg, fmt)
    else:
        _after_tools(ep, result, tokenizer, cfg, fmt)


def _tool_request(ep: Episode, text: str, last_turn: bool, fmt: ToolFormat) -> tuple | None:
    """This turn's request to `EnvClient.call_tools`; None (and a finish reason) when there is none."""
    parsed = fmt.parse(text)
    if not parsed.calls and not parsed.errors:
        ep.finish_reason = "answer"
        return None
    if last_turn:
        ep.finish_reason = "max_turns"
        return None
    ep.num_tool_calls += len(parsed.calls) + len(parsed.errors)
    return (ep.key, parsed.calls, parsed.errors)


def _after_tools(ep: Episode, tool_results: list, tokenizer, cfg: RolloutConfig, fmt: ToolFormat) -> None:
    ep.num_tool_errors += sum(r.error for r in tool_results)
    texts, assistant = [r.text for r in tool_results], ep.messages[-1]
    ep.messages.extend(tool_messages(assistant, texts))
    _append_segments(ep, fmt.tool_response_segments(texts, assistant.get("tool_calls")), tokenizer, cfg)


def _after_step(ep: Episode, result, last_turn: bool, tokenizer, cfg: RolloutConfig, fmt: ToolFormat) -> None:
    """Apply a turn-based environment's answer (`envs.host.TurnResult`) to the episode."""
    if result.error:
        # The host ended the episode (the env's state is unknown after a failed step). The error text has no place
        # in the conversation, which must end with the assistant's turn, so it goes to the log.
        logger.warning("environment of %s: %s", ep.key, result.observation)
        ep.num_step_errors += 1
        ep.finish_reason = "error"
        return
    if result.done:
        ep.finish_reason = "done"
        return
    if last_turn:
        ep.finish_reason = "max_turns"
        return
    if isinstance(result.observation, list):  # tool results, then perhaps the next user message (envs.base)
        if _append_segments(ep, fmt.observation_segments(result.observation), tokenizer, cfg):
            text, turn = ep.messages[-1]["content"], sum(m["role"] == "assistant" for m in ep.messages) - 1
            assistant = assistant_message(text, fmt.parse(text), turn)
            tools = [m["content"] for m in result.observation if m["role"] == "tool"]
            if tools:  # the turn's calls, structured, so that each result answers its call
                ep.messages[-1] = assistant
            ep.messages.extend(tool_messages(assistant, tools))
            ep.messages.extend(m for m in result.observation if m["role"] == "user")
        return
    _user_turn(ep, result.observation, tokenizer, cfg, fmt)


def _user_turn(ep: Episode, observation: str | None, tokenizer, cfg: RolloutConfig, fmt: ToolFormat) -> None:
    observation = observation or ""  # None: the environment has nothing to say; the user turn is empty
    if _append_segments(ep, fmt.user_turn_segments(observation), tokenizer, cfg):
        # Only once its tokens are in: the completion's last message stays the assistant's (what rewards judge).
        ep.messages.append({"role": "user", "content": observation})


def _after_move(ep: Episode, result, tokenizer, cfg: RolloutConfig, fmt: ToolFormat) -> None:
    """Apply a game's answer to `ep`'s move (rollout/selfplay.py): it hands the turn to a seat, or ends the game."""
    game = ep.game
    if result.error:  # the game's state is unknown: it ends for both seats
        logger.warning("game of %s: %s", ep.key, result.observation)
        ep.num_step_errors += 1
        game.end("error")
        return
    if result.rewards is not None:
        game.end("done", result.rewards)
        return
    game.to_move = result.seat
    mover = game.seats[result.seat]
    if mover.render is not None:
        mover.begin(result.observation)
    elif len(mover.turns) >= cfg.max_turns:
        mover.finish_reason = "max_turns"  # it cannot move: `_forfeit`
    else:
        _user_turn(mover, result.observation, tokenizer, cfg, fmt)  # "length" if it does not fit: `_forfeit`


async def _forfeit(games: list[Game], envs: EnvClient) -> None:
    """Each game whose seat to move cannot move (its turn was cut, its turns are used up) ends by its forfeit."""
    due = [g for g in games if g.forfeit_due()]
    if not due:
        return
    for game, result in zip(due, await envs.call_turns([(g.key, None) for g in due])):
        if result.error or result.rewards is None:
            logger.warning("game %s: its forfeit did not end it: %s", game.key, result.observation)
            game.end("error")
        else:
            game.end("done", result.rewards)


def _append_segments(ep: Episode, segments: list[Segment], tokenizer, cfg: RolloutConfig) -> bool:
    """Append environment segments; False (finish reason "length") when they leave no room for another token."""
    ids, roles = encode_segments(tokenizer, segments)
    # Room is needed for the segments plus at least one generated token.
    if len(ep.ids) + len(ids) >= cfg.max_total_tokens:
        ep.finish_reason = "length"
        return False
    ep.ids.extend(ids)
    ep.roles.extend(roles)
    ep.logprobs.extend([0.0] * len(ids))
    return True
