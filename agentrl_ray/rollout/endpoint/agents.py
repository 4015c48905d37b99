"""The agent kind (`env.agent`): the user's `async def run(client, row)` once per trajectory, in a process of its own,
against the worker's endpoint; its calls become the trajectory's training sequences.

Containment, as for user environments (docs/reliability.md): each trajectory's program runs in a child forked from
a zygote that imported `openai` and the agent's module once (`child.py`: a fork costs milliseconds; a fresh
interpreter importing `openai` would cost a second of CPU per trajectory). It is killed at `env.agent_timeout_s`; an
exception, an exit, a crash or a hang costs that trajectory only: reward 0, finish reason "error", the sequences of
the calls it made still trained (its failure is the policy's outcome as much as the program's). A call past the
budget is refused by the endpoint with an OpenAI-style error; a program that stops there (raising or not) is scored
on what it did, finish reason "max_turns" or "length". At most `env.agent_processes` programs run at once per worker.

Rewards: the number `run` returns; `None` (or nothing): the reward functions score the transcript (the last call's
messages and its reply, after the first call's prompt), with TRL's signature, as for a built-in environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from asyncio.subprocess import PIPE
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.chat_format import prompt_messages
from agentrl_ray.config import EnvConfig, RewardConfig, RolloutConfig
from agentrl_ray.rewards import score
from agentrl_ray.rewards.scoring import RewardState
from agentrl_ray.rollout.endpoint.calls import canonical
from agentrl_ray.rollout.endpoint.server import Endpoint, Session
from agentrl_ray.rollout.endpoint.stitch import Sequence, stitch
from agentrl_ray.types import RolloutTimings, SequencePart, TokenRole, Trajectory, role_masks

logger = logging.getLogger("agentrl_ray")
ZYGOTE_START_S = 300.0  # importing openai and the agent's module on a loaded machine


@dataclass
class Outcome:
    reward: float | None
    error: str  # "" when the program returned


@dataclass
class _Child:
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # it answered, or it ended
    pid: int = 0
    answer: list | None = None
    exit: int | None = None


class Zygote:
    """The worker's handle on `child.py`'s zygote: one agent process per `run`, killed at its deadline."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.proc: asyncio.subprocess.Process | None = None
        self.children: dict[str, _Child] = {}
        self._starting = asyncio.Lock()

    async def _start(self) -> None:
        """Start the zygote and wait until it imported the agent: its start is not a trajectory's time."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # what this worker imports
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentrl_ray.rollout.endpoint.child", self.agent, stdin=PIPE, stdout=PIPE, env=env
        )
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), ZYGOTE_START_S)
        except TimeoutError:
            ready = b""
        if b'"ready"' not in ready:
            proc.kill()
            raise RuntimeError(f"the env.agent zygote did not start (see its stderr in the worker's log): {ready!r}")
        self.proc = proc
        asyncio.create_task(self._read(proc))

    async def _read(self, proc) -> None:
        while line := await proc.stdout.readline():
            message = json.loads(line)
            child = self.children.get(message["id"])
            if child is None:
                continue
            child.pid = message.get("pid", child.pid)
            child.answer = message.get("answer", child.answer)
            child.exit = message.get("exit", child.exit)
            if "answer" in message or "exit" in message:
                child.answered.set()
        for child in self.children.values():  # the zygote itself died: every child still running is lost
            child.exit = -1 if child.exit is None else child.exit
            child.answered.set()

    async def run(self, row: dict, base_url: str, key: str, timeout_s: float) -> Outcome:
        async with self._starting:  # the first of many concurrent trajectories starts it, the others wait
            if self.proc is None or self.proc.returncode is not None:
                await self._start()
        child = self.children[key] = _Child()
        request = {"id": key, "row": row, "base_url": base_url, "key": key, "timeout_s": timeout_s}
        try:
            self.proc.stdin.write(json.dumps(request, default=str).encode() + b"\n")
            await self.proc.stdin.drain()
            await asyncio.wait_for(child.answered.wait(), timeout_s)
        except TimeoutError:
            return Outcome(None, f"agent still running after env.agent_timeout_s={timeout_s}s: killed")
        finally:
            self.children.pop(key)
            if child.answer is None and child.exit is None and child.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)  # the zygote reaps it
        if child.answer is None:
            return Outcome(None, f"agent process ended without an answer (exit code {child.exit})")
        status, value = child.answer
        return Outcome(value, "") if status == "ok" else Outcome(None, value)


class AgentRunner:
    """The rollouts of one worker whose trajectories are agent programs."""

    def __init__(self, endpoint: Endpoint, env_cfg: EnvConfig, cfg: RolloutConfig, reward_cfg: RewardConfig, funcs):
        self.endpoint, self.env_cfg, self.cfg, self.reward_cfg, self.funcs = endpoint, env_cfg, cfg, reward_cfg, funcs
        self.zygote = Zygote(env_cfg.agent)
        self.slots = asyncio.Semaphore(env_cfg.agent_processes)

    async def rollout(
        self, rows: list[dict], keys: list[str], temperature: float, seed: int, version: int, timings: RolloutTimings
    ) -> list[Trajectory]:
        """One trajectory per key (`keys[i]` samples `rows[i]`), in order."""
        if not self.endpoint.base_url:
            await self.endpoint.start()
        t0 = time.perf_counter()
        done = await asyncio.gather(*(self._run(row, key, temperature, seed) for row, key in zip(rows, keys)))
        sessions, outcomes = [d[0] for d in done], [d[1] for d in done]
        timings.generate_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        trajs = self._score(rows, sessions, outcomes, version)
        timings.reward_s += time.perf_counter() - t0
        return trajs

    async def _run(self, row: dict, key: str, temperature: float, seed: int) -> tuple[Session, Outcome]:
        async with self.slots:
            # Opened only now: a batch waits for the open trajectories' calls, not for programs not yet started.
            session = self.endpoint.open(key, temperature, seed)
            try:
                return session, await self._process(row, key)
            finally:
                self.endpoint.finish(key)

    async def _process(self, row: dict, key: str) -> Outcome:
        return await self.zygote.run(row, self.endpoint.base_url, key, self.env_cfg.agent_timeout_s)

    # ---------------------------------------------------------------- trajectories

    def _score(self, rows: list[dict], sessions: list[Session], outcomes: list[Outcome], version: int):
        prompts, completions, stats = [], [], []
        sequences = [stitch(s.calls) for s in sessions]
        for row, s, o in zip(rows, sessions, outcomes):
            prompt, completion = _transcript(s) if s.calls else (prompt_messages(row["prompt"]), [])
            prompts.append(prompt)
            completions.append(completion)
            stats.append(self._stats(s, o))
            if o.error and not s.refused:
                logger.warning("agent of %s: %s", s.key, o.error)
        columns = {k: [r.get(k) for r in rows] for k in rows[0]}
        rewards, parts = score(
            self.funcs,
            self.reward_cfg.weights,
            completions,
            columns,
            episode_stats=stats,
            env_rewards=[None] * len(rows),
            completion_ids=[q[-1].ids[q[-1].prompt_len :] if q else [] for q in sequences],
            trainer_state=RewardState(global_step=version),
        )
        out = []
        for row, s, o, seqs, prompt, completion, st, r, p in zip(
            rows, sessions, outcomes, sequences, prompts, completions, stats, rewards, parts
        ):
            if o.reward is not None:
                r, p = o.reward, {"agent": o.reward}
            elif st["finish_reason"] == "error":
                r, p = 0.0, {**p, "agent/error": 1.0}
            out.append(self._trajectory(row, s, seqs, st, float(r), p, prompt, completion, version))
        return out

    def _stats(self, s: Session, o: Outcome) -> dict[str, Any]:
        refused = {"turn_budget_exceeded": "max_turns", "context_length_exceeded": "length"}.get(s.refused)
        if o.error and not refused:
            finish = "error"
        elif refused:
            finish = refused
        else:
            finish = "length" if s.calls and s.calls[-1].choices[0].finish_reason == "length" else "answer"
        sampled = [c for call in s.calls for c in call.choices]
        return {
            "finish_reason": finish,
            "num_tool_calls": sum(len(c.message.get("tool_calls") or []) for c in sampled),
            "num_tool_errors": 0,
            "num_steps": len(s.calls),
            "num_step_errors": 0,
            "num_tokens": sum(len(c.token_ids) for c in sampled),
        }

    def _trajectory(self, row, s: Session, sequences, st, reward, parts, prompt, completion, version) -> Trajectory:
        if not sequences:  # no call made: a prompt-only row, in no loss, so that the group keeps its size
            ids = self.endpoint.renderer.tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            sequences = [Sequence(list(ids), [TokenRole.PROMPT] * len(ids), [0.0] * len(ids), len(ids), -1)]
        *earlier, last = sequences
        return Trajectory(
            prompt_id=str(row["id"]),
            sample_index=0,
            token_ids=last.ids,
            **role_masks(last.roles),
            rollout_logprobs=last.logprobs,
            reward=reward,
            reward_parts=parts,
            policy_version=min((c.policy_version for c in s.calls), default=version),
            finish_reason=st["finish_reason"],
            prompt_len=last.prompt_len,
            num_tool_calls=st["num_tool_calls"],
            num_steps=st["num_steps"],
            prompt_messages=prompt,
            completion_messages=completion,
            earlier_parts=[
                SequencePart(q.ids, **role_masks(q.roles), rollout_logprobs=q.logprobs, prompt_len=q.prompt_len)
                for q in earlier
            ],
        )


def _transcript(s: Session) -> tuple[list[dict], list[dict]]:
    """(prompt, completion) messages of a trajectory: the first call's messages are the prompt; the completion is
    the rest of the last call's messages and its reply (all of them and the reply if the agent rewrote the prompt)."""
    prompt = s.calls[0].messages
    last = s.calls[-1]
    conversation = [*last.messages, last.choices[0].message]
    if canonical(conversation[: len(prompt)]) == canonical(prompt):
        return prompt, conversation[len(prompt) :]
    return prompt, conversation
