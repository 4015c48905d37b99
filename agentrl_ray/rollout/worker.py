"""RolloutWorker: a thin Ray actor owning one rollout engine (`rollout.backend`: vLLM or torch, `rollout/engine.py`).

It samples groups of trajectories with the multi-turn loop (tool calls, or user turns for a turn-based environment;
environments live in separate env actors) and scores them with the reward functions. New weights after every
learner step are applied by its `sync.receiver.WeightReceiver` (this actor only exposes its two entry points).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from typing import Any

import torch

from agentrl_ray.chat_format import prompt_messages
from agentrl_ray.config import EnvConfig, ModelConfig, RewardConfig, RolloutConfig
from agentrl_ray.data import row_tools
from agentrl_ray.envs.base import players
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.loading import env_class as make_env_class
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.infra import startup
from agentrl_ray.infra.allocator import release_freed_memory
from agentrl_ray.infra.threads import ThreadPolicy
from agentrl_ray.rewards import load_reward_functions, score
from agentrl_ray.rewards.scoring import RewardState
from agentrl_ray.rollout.agent_loop import Episode, run_episodes, run_episodes_streaming
from agentrl_ray.rollout.backends import make_engine
from agentrl_ray.rollout.continuity import continuity_break, token_versions
from agentrl_ray.rollout.engine_modes import EngineModes
from agentrl_ray.rollout.selfplay import SEATS, pair_group
from agentrl_ray.rollout.tool_format import tool_format
from agentrl_ray.rollout.turn_scheduler import TurnScheduler
from agentrl_ray.sync.collective import CollectiveBackend
from agentrl_ray.sync.receiver import WeightReceiver
from agentrl_ray.types import RolloutTimings, Trajectory, TrajectoryGroup, WeightUpdate, role_masks

log = logging.getLogger("agentrl_ray")


class RolloutWorker:
    def __init__(
        self,
        index: int,
        model_path: str,
        model_cfg: ModelConfig,
        cfg: RolloutConfig,
        env_cfg: EnvConfig,
        reward_cfg: RewardConfig,
        env_hosts: list[Any],
        seed: int,
        collective: CollectiveBackend,
        threads: ThreadPolicy,
        modes: EngineModes = EngineModes(),
        kv_sequences: int | None = None,
    ) -> None:
        """`kv_sequences`: the most sequences one rollout call runs on this engine at once (`pool.sequences_per_engine`;
        default `max_num_seqs`), which sizes a CPU engine's KV cache unless `rollout.kv_cache_gib` is set."""
        startup.mark("engine", "actor built (imports done)")
        # Before the engine starts: vLLM CPU freezes the thread count then (its env vars came with the process).
        torch.set_num_threads(threads.engine_threads())
        from agentrl_ray.builtin.tokenizer import load_tokenizer

        self.index = index
        self.cfg = cfg
        self.reward_cfg = reward_cfg
        self.envs = EnvClient(env_hosts, env_cfg.name, env_cfg.kwargs, env_cfg.tool_specs())
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {model_path} has no eos token: turns could never end")
        env_class = make_env_class(env_cfg.name, env_cfg.tool_specs())
        self.tools = tool_schemas(env_class)
        # Decided once from the class: a turn-based environment (it defines step) talks in user turns, not tools.
        self.turn_based = callable(getattr(env_class, "step", None))
        self.players = players(env_class)  # 2: a game, samples 2i and 2i+1 of a group play each other (selfplay.py)
        self.tool_format = tool_format(self.tokenizer, cfg.tool_format)
        if self.turn_based and self.tool_format.framing is not None and self.tool_format.framing.user_turns:
            # Found at start, not at an episode's second turn: a turn-based environment answers in user turns.
            raise ValueError(f"{env_cfg.name} answers in user turns, which {model_path}'s chat template cannot "
                             f"follow a turn with: {self.tool_format.framing.user_turns}")  # fmt: skip
        self.reward_funcs = load_reward_functions(reward_cfg.functions)
        startup.mark("engine", "tokenizer, env and rewards loaded")
        self.engine = make_engine(
            cfg.backend,
            model_path,
            model_cfg,
            cfg,
            seed=seed + index,
            use_gpu=threads.engines_on_gpu,
            modes=modes,
            kv_sequences=kv_sequences or cfg.max_num_seqs,
        )
        self.agents = None  # env.agent: trajectories are agent programs against the engine's OpenAI endpoint
        if env_cfg.agent:
            from agentrl_ray.rollout.endpoint.agents import AgentRunner
            from agentrl_ray.rollout.endpoint.server import Endpoint

            endpoint = Endpoint(self.engine, self.tokenizer, cfg, lambda: self.weights.version)
            self.agents = AgentRunner(endpoint, env_cfg, cfg, reward_cfg, self.reward_funcs)
        adapter = self.engine.set_adapter if self.engine.native_lora else None  # native LoRA, else merged full weights
        self.weights = WeightReceiver(model_path, self.engine.load_weights, collective, load_adapter=adapter)
        # One rollout call at a time. The pool never sends two, but a learner restarted by Ray Train may send its
        # first while the dead learner's last call still runs here: it waits for it (same environment keys).
        self._one_rollout = asyncio.Lock()
        # The streaming pipeline (sync.pipeline=stream): many calls at once, their episodes' turns batched together;
        # weights and the probe take the engine between two batched calls (rollout/turn_scheduler.py).
        self.scheduler = TurnScheduler(self.engine, lambda: self.weights.version) if modes.stream else None
        self._loaded: tuple | None = None  # the stream pipeline's last loaded update (`_receive_once`)
        self._unreported_load_s = 0.0  # weight loads not yet in a rollout's timings (`_load`)
        self._active_calls = 0  # rollout calls running now (`active_calls`)
        startup.mark("engine", "engine loaded")

    # ---------------------------------------------------------------- rollouts

    async def rollout(
        self,
        rows: list[dict[str, Any]],
        group_size: int,
        temperature: float,
        seed: int,
        weights: WeightUpdate | None = None,
        redo: bool = False,
    ) -> tuple[list[TrajectoryGroup], RolloutTimings]:
        """Sample `group_size` trajectories for each row; returns the groups and timing/env stats. `weights`
        (the sender's pending update) are loaded first. `redo`: this call repeats one whose work was lost
        (rollout/recovery.py); environments it left open under the same keys are closed first."""
        self._active_calls += 1
        try:
            if self.scheduler is not None:  # many calls at once, their turns batched by the scheduler (no sleep)
                return await self._rollout(rows, group_size, temperature, seed, weights, redo)
            async with self._one_rollout:
                try:
                    return await self._rollout(rows, group_size, temperature, seed, weights, redo)
                finally:
                    # A learner rank shares the GPU (engine_modes): free it for the step; the next use wakes it.
                    self.engine.sleep()
                    release_freed_memory()  # the decode steps' logits, kept mapped during the call (allocator.py)
        finally:
            self._active_calls -= 1

    async def _rollout(
        self,
        rows: list[dict[str, Any]],
        group_size: int,
        temperature: float,
        seed: int,
        weights: WeightUpdate | None,
        redo: bool,
    ) -> tuple[list[TrajectoryGroup], RolloutTimings]:
        t_start = time.perf_counter()
        timings = RolloutTimings()
        if weights is not None:
            await self.receive_weights(weights)
        # Every load since the last call's report, here or between calls (the integrity probe's, the stream
        # pipeline's in-flight ones): each is reported once, with the next rollout's timings.
        timings.load_weights_s, self._unreported_load_s = self._unreported_load_s, 0.0
        if self.agents is not None:
            return await self._agent_rollout(rows, group_size, temperature, seed, timings, t_start)
        episodes = await self._start_episodes(rows, group_size, seed, redo)
        try:
            loop_args = dict(
                temperature=temperature,
                seed=seed,
                stop_token_ids=self.tool_format.stop_token_ids(self.tokenizer),
                timings=timings,
                turn_based=self.turn_based,
                fmt=self.tool_format,
            )
            if self.scheduler is not None:
                await run_episodes_streaming(episodes, self.scheduler, self.envs, self.tokenizer, self.cfg, **loop_args)
            else:
                version = self.weights.version
                await run_episodes(
                    episodes, self.engine, self.envs, self.tokenizer, self.cfg, version=version, **loop_args
                )
            t0 = time.perf_counter()
            env_rewards = await self._env_rewards(episodes)
            expanded = [row for row in rows for _ in range(group_size)]
            columns = {k: [r.get(k) for r in expanded] for k in expanded[0]}
            rewards, parts = score(
                self.reward_funcs,
                self.reward_cfg.weights,
                [e.messages for e in episodes],
                columns,
                episode_stats=[self._episode_stats(e) for e in episodes],
                env_rewards=env_rewards,
                # What TRL's GRPOTrainer also passes: each completion's token ids (tool results included) and the
                # training progress (the weights version is the number of optimizer steps taken).
                completion_ids=[e.ids[e.prompt_len :] for e in episodes],
                trainer_state=RewardState(global_step=self.weights.version),
            )
            timings.reward_s += time.perf_counter() - t0
        finally:
            await self.envs.close([e.key for e in episodes])
        trajs = [self._to_trajectory(e, r, p) for e, r, p in zip(episodes, rewards, parts)]
        groups = [
            TrajectoryGroup(str(row["id"]), trajs[i * group_size : (i + 1) * group_size]) for i, row in enumerate(rows)
        ]
        timings.worker_s = time.perf_counter() - t_start
        return groups, timings

    async def _env_rewards(self, episodes: list[Episode]) -> list[float | None]:
        """Each episode's environment reward: its environment's, or its seat's in its game (rollout/selfplay.py)."""
        alone = [e for e in episodes if e.game is None]
        asked = iter(await self.envs.rewards([(e.key, _last_assistant_text(e.messages)) for e in alone]))
        return [next(asked) if e.game is None else e.game.reward(e.seat) for e in episodes]

    async def _agent_rollout(self, rows, group_size, temperature, seed, timings, t_start):
        keys = [f"w{self.index}-s{seed}-{i}-{row['id']}-{j}" for i, row in enumerate(rows) for j in range(group_size)]
        expanded = [row for row in rows for _ in range(group_size)]
        trajs = await self.agents.rollout(expanded, keys, temperature, seed, self.weights.version, timings)
        for i, t in enumerate(trajs):
            t.sample_index = i % group_size
        groups = [
            TrajectoryGroup(str(row["id"]), trajs[i * group_size : (i + 1) * group_size]) for i, row in enumerate(rows)
        ]
        timings.worker_s = time.perf_counter() - t_start
        return groups, timings

    async def _start_episodes(
        self, rows: list[dict[str, Any]], group_size: int, seed: int, redo: bool = False
    ) -> list[Episode]:
        keys = []
        seen: set[str] = set()
        for row in rows:
            for j in range(group_size):
                key = f"w{self.index}-s{seed}-{row['id']}-{j}"
                while key in seen:  # the same row twice in one batch (a window across an epoch boundary)
                    key += "+"
                seen.add(key)
                keys.append(key)
        episodes = []
        # A group shares its prompt (ids, messages) unless reset() differs.
        prompts: dict[tuple[int, str | None], tuple[list[int], list[dict]]] = {}
        if self.players == SEATS and group_size % SEATS:
            raise ValueError(f"a game of two players pairs the samples of a group: {group_size} samples is odd")
        if redo:  # a dead worker never closed them; a restarted env host has none (closing is then a no-op)
            await self.envs.close(keys)
        try:
            # Self-play: one environment per game, under its seat 0's key (the even sample); seat 1 has no prompt
            # until the game first asks it to move (`Episode.render`).
            hosted = range(0, len(keys), self.players)
            reset_texts = await self.envs.create([(keys[i], rows[i // group_size]) for i in hosted])
            for i, extra in zip(hosted, reset_texts):
                row = rows[i // group_size]
                rendered = prompts.get((i // group_size, extra))
                if rendered is None:
                    rendered = prompts[(i // group_size, extra)] = self._prompt_ids(row, extra)
                ids, messages = rendered
                episodes.append(
                    Episode(keys[i], str(row["id"]), i % group_size, list(ids), len(ids), prompt_messages=messages)
                )
                if self.players == SEATS:
                    render = functools.partial(self._prompt_ids, row)
                    episodes.append(Episode(keys[i + 1], str(row["id"]), (i + 1) % group_size, [], 0, render=render))
            if self.players == SEATS:
                pair_group(episodes)
        except BaseException:
            # A failed reset on one host (its batch closes itself), or a prompt over the token budget: close every
            # environment of the batch (closing an unknown key is a no-op), then report it.
            await self.envs.close(keys)
            raise
        return episodes

    def _prompt_ids(self, row: dict[str, Any], extra: str | None) -> tuple[list[int], list[dict]]:
        prompt = row["prompt"]
        messages = prompt_messages(prompt, self.cfg.system_prompt)
        if extra:
            # TRL convention: text returned by reset() is appended to the last user message.
            messages[-1]["content"] = f"{messages[-1]['content']}{extra}"
        ids = self.tokenizer.apply_chat_template(
            messages, tools=row_tools(row, self.tools), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if len(ids) + 1 >= self.cfg.max_total_tokens:
            raise ValueError(
                f"prompt {row['id']} is {len(ids)} tokens, over rollout.max_total_tokens={self.cfg.max_total_tokens}"
            )
        return list(ids), messages

    def _episode_stats(self, ep: Episode) -> dict[str, Any]:
        return {
            "finish_reason": ep.finish_reason,
            "num_tool_calls": ep.num_tool_calls,
            "num_tool_errors": ep.num_tool_errors,
            "num_steps": ep.num_steps,
            "num_step_errors": ep.num_step_errors,
            "num_tokens": len(ep.ids) - ep.prompt_len,
        }

    def _to_trajectory(self, ep: Episode, reward: float, parts: dict[str, float]) -> Trajectory:
        traj = Trajectory(
            prompt_id=ep.prompt_id,
            sample_index=ep.sample_index,
            token_ids=ep.ids,
            **role_masks(ep.roles),
            rollout_logprobs=ep.logprobs,
            reward=float(reward),
            reward_parts=parts,
            policy_version=min((turn.version for turn in ep.turns), default=self.weights.version),
            token_versions=token_versions(ep.turns, len(ep.ids)),
            finish_reason=ep.finish_reason,
            prompt_len=ep.prompt_len,
            num_tool_calls=ep.num_tool_calls,
            num_tool_errors=ep.num_tool_errors,
            num_steps=ep.num_steps,
            num_step_errors=ep.num_step_errors,
            prompt_messages=ep.prompt_messages,
            completion_messages=ep.messages,
        )
        traj.continuity_break = continuity_break(ep.turns, traj.token_ids, traj.action_mask, traj.rollout_logprobs)
        return traj

    # ---------------------------------------------------------------- weights (see sync.receiver)

    def get_version(self) -> int:
        return self.weights.version

    def pid(self) -> int:
        """This actor's process id: a restart changes it (rollout/recovery.py); chaos tests kill it."""
        return os.getpid()

    def active_calls(self) -> int:
        """Rollout calls running on this worker now (chaos tests kill it while some are)."""
        return self._active_calls

    def kv_cache_tokens(self) -> int:
        """Tokens of context the engine's KV cache holds, as its backend allocated it."""
        return self.engine.kv_cache_tokens()

    async def receive_weights(self, update: WeightUpdate) -> int:
        if self.scheduler is not None:  # between two batched engine calls: a turn boundary of every episode
            async with self.scheduler.exclusive():
                return await self._receive_once(update)
        return await self._load(update)

    async def _load(self, update: WeightUpdate) -> int:
        t = time.perf_counter()
        try:
            return await self.weights.receive(update)
        finally:
            self._unreported_load_s += time.perf_counter() - t

    async def _receive_once(self, update: WeightUpdate) -> int:
        """The stream pipeline sends each update to every engine as soon as it is pushed, and again with the calls
        that must see it (an evaluation, the probe: Ray does not order an async actor's calls): loaded once."""
        key = (update.version, update.payload.hex() if hasattr(update.payload, "hex") else id(update))
        if key != self._loaded:
            await self._load(update)
            self._loaded = key
        return self.weights.version

    def join_weight_group(self, master_addr: str, port: int, world_size: int, rank: int, backend) -> bool:
        self.weights.join_group(master_addr, port, world_size, rank, backend)
        return True

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Deterministic generation (weight-sync tests): (token ids, logprobs) per prompt."""
        # ignore_eos: compare a fixed number of tokens with transformers' generate(min_new_tokens=max_tokens).
        gens = self.engine.generate(
            prompts, [max_tokens] * len(prompts), temperature=0.0, top_p=1.0, stop_token_ids=[], ignore_eos=True
        )
        return [(g.token_ids, g.logprobs) for g in gens]

    async def probe(self, sequences: list[list[int]], weights: WeightUpdate | None = None) -> list[list[float]]:
        """The integrity probe (learner/integrity.py): teacher-forced log-probs of `sequences` on this engine's
        weights, after loading `weights` (the sender's pending update) if given."""
        async with self.scheduler.exclusive() if self.scheduler is not None else self._one_rollout:
            try:
                if weights is not None and self.scheduler is not None:
                    await self._receive_once(weights)
                elif weights is not None:
                    await self._load(weights)
                return self.engine.score(sequences)
            finally:
                self.engine.sleep()


def _last_assistant_text(messages: list[dict[str, str]]) -> str:
    """What an env's reward(completion) judges: the last assistant turn (a budget can end a rollout after tool
    results, so the last message is not always the assistant's)."""
    return next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
