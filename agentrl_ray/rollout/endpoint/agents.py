"""The agent kind (`env.agent`): the user's `async def run(client, row)` once per trajectory, in a process of its own,
against the worker's endpoint; its calls become the trajectory's training sequences.

Each trajectory's program runs in a child forked from a zygote (`envs/isolation/zygote.py`, the one user
environments use) that imported `openai`, what a first call imports, and the agent's module once: a fork costs
milliseconds, where a fresh interpreter importing `openai` costs a second of CPU per trajectory. It is killed at
`env.agent_timeout_s`; an exception, an exit, a crash or a hang costs that trajectory only: reward 0, finish reason
"error", the sequences of the calls it made still trained (its failure is the policy's outcome as much as the
program's). A call past the budget is refused by the endpoint with an OpenAI-style error; a program that stops there
(raising or not) is scored on what it did, finish reason "max_turns" or "length". At most `env.agent_processes`
programs run at once per worker.

Threat model: the program is the user's, but what it does is driven by a policy under RL pressure (it runs the
model's tool calls, code, shell commands). The author is trusted, its behaviour is not. Contained at each level
(`env.isolation`; `thread` and `process` mean `auto` here: a program always has a process of its own):
- `auto`: its own session and process group, `AGENT_LIMITS`' rlimits (address space beyond the zygote's, open
  files, file size, no core dumps), its own empty TMPDIR; as root, also the memory and pids cgroup of a leased
  slot (`cgroups.py`), so that the final kill is exact. When the trajectory ends (answer, exit, crash, deadline),
  the child, its process group and the cgroup are SIGKILLed and the TMPDIR removed. NOT isolated at `auto`: it runs
  as the worker's user (root on our workers) with the worker's files, environment variables and network (Ray's
  ports, the endpoint under any key it can guess: none, see below); without a cgroup (not root) a process that
  leaves its process group (`setsid`) outlives the trajectory, and what it writes outside TMPDIR stays.
- `sandbox`: every layer of an environment at `env.isolation=sandbox` (`envs/isolation/confine.py`): a leased
  unprivileged uid without capabilities or groups, the slot's cgroup, private tmpfs /tmp, /var/tmp and /dev/shm,
  its own SysV IPC, a /proc that shows only its own processes, a scrubbed environment, stdin/stdout/stderr on
  /dev/null, and a network namespace with a downed loopback: no port of this machine or any other (Ray's GCS,
  raylets, dashboard, the endpoint's TCP port) is reachable. Its one way out is its endpoint: a Unix socket at a
  random name only it is told, in a directory no one but root may list, whose connections the worker pipes to the
  endpoint and nowhere else (`envs/isolation/bridge.py`); its client speaks HTTP over that socket. When the
  trajectory ends everything of its uid and cgroup is killed, its socket removed, its tmpfs gone with its mount
  namespace. NOT isolated: the same kernel (no seccomp); files "others" may read (the code, the venv, /etc less
  /etc/shadow): keep secrets in files that are not world-readable; the CPU, shared with the engine.
- Either level: the program's API key is a random secret, not the trajectory's key (which names prompt and sample
  and is guessable), so a program cannot make calls in another trajectory's name; the row and the key reach the
  child on its own socket after the fork, never through the zygote, whose memory every later child inherits. What
  a child sends back is JSON (never unpickled), checked to be an answer, at most 4 MiB. The agent's module is
  imported unconfined, in the zygote (as an environment's module is in the env host): import-time code is trusted;
  modules `run` imports later must be readable by the sandbox uid (the venv under /root is not: import at module
  level).
Measured by tests/unit/test_agent_isolation.py with a hostile program at both levels beside a well-behaved one.

Rewards: the number `run` returns, or `{"reward": r, "parts": {name: value}}` (its components, logged as reward parts
`agent/<name>`); `None` (or nothing): the reward functions score the transcript (the last call's messages and its
reply, after the first call's prompt), with TRL's signature, as for a built-in environment.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import pickle
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agentrl_ray.chat_format import prompt_messages
from agentrl_ray.config import EnvConfig, RewardConfig, RolloutConfig
from agentrl_ray.envs.isolation.bridge import Bridge
from agentrl_ray.envs.isolation.child import describe, frame, read_reply, recv_frame, send_frame
from agentrl_ray.envs.isolation.children import Children, EnvError
from agentrl_ray.envs.isolation.sandbox_layers import Layers, SandboxLimits, warn_once
from agentrl_ray.envs.loading import BY_VALUE, import_object
from agentrl_ray.rewards import score
from agentrl_ray.rewards.scoring import RewardState
from agentrl_ray.rollout.endpoint.calls import canonical
from agentrl_ray.rollout.endpoint.child import run_agent
from agentrl_ray.rollout.endpoint.stitch import Sequence, stitch
from agentrl_ray.types import RolloutTimings, SequencePart, TokenRole, Trajectory, role_masks

if TYPE_CHECKING:  # the server imports the engine (torch): the zygote, which imports this module, must not
    from agentrl_ray.rollout.endpoint.server import Endpoint, Session

logger = logging.getLogger("agentrl_ray")
ZYGOTE_START_S = 300.0  # importing openai and the agent's module on a loaded machine
SANDBOX_BASE_URL = "http://agent/v1"  # any host: the client's transport goes to the program's socket
_WHO = "the agent's process"
AGENT_LIMITS = SandboxLimits(
    memory_mb=1024, total_memory_mb=2048, max_processes=64, max_open_files=256, max_file_size_mb=256, disk_mb=256
)
"""Per program: 1 GiB of address space beyond what the zygote mapped, 2 GiB for its processes together (tmpfs files
included), 64 processes and threads, 256 open files, files up to 256 MiB, 256 MiB in each private temp dir."""
# What a program's first call imports beyond `openai` itself (openai 1.x/2.x, httpx 0.28): loaded in the zygote,
# since a sandboxed child may not read the venv.
CLIENT_MODULES = (
    "openai",
    "openai.resources.chat",
    "openai.lib.streaming.chat",
    "httpx",
    "httpcore",
    "anyio._backends._asyncio",
    "jiter",
    "certifi",
    "concurrent.futures.thread",
)


@dataclass
class Outcome:
    reward: float | None
    error: str  # "" when the program returned
    parts: dict[str, float] = field(default_factory=dict)  # the components the program gave with its reward


# ---------------------------------------------------------------- the child's side (in the zygote's fork)


@dataclass(frozen=True)
class AgentSpec:
    """What the zygote forks an agent's child from (zygote.py): no row, no key (those come on the child's socket)."""

    agent: str
    confinement: Any = None  # confine.Confinement, set by Children.spawn

    def load(self) -> tuple | str:
        return _load(self.agent)

    def serve(self, sock: socket.socket, loaded: tuple | str) -> None:
        """Say whether the agent loaded (before any of `run` executes: the host may trust this frame), take the
        trajectory's request, run the program, answer."""
        failed = isinstance(loaded, str)
        send_frame(sock, json.dumps(["error", loaded, False] if failed else ["ok", None, False]).encode())
        body = None if failed else recv_frame(sock)
        if body is None:
            return
        request = pickle.loads(body)  # from the host, which is trusted
        fn, base = loaded
        if request["uds"]:
            import httpx

            transport = httpx.AsyncHTTPTransport(uds=request["uds"], verify=False)  # plain HTTP on a Unix socket
            base = base.with_options(http_client=httpx.AsyncClient(transport=transport, trust_env=False))
        if request["tmpdir"]:
            os.environ["TMPDIR"] = tempfile.tempdir = request["tmpdir"]
        args = (request["row"], request["base_url"], request["key"], request["timeout_s"])
        send_frame(sock, json.dumps([*run_agent(fn, base, *args), False]).encode())


@functools.cache
def _load(agent: str) -> tuple | str:
    """The agent's function and the client each child copies (with its URL and key: creating one costs 70-300 ms of
    CPU), or why they cannot be loaded."""
    try:
        import openai

        fn = import_object(agent, "env.agent")
        base = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="unset", max_retries=0)
        base.chat.completions  # noqa: B018 - loads the resources a first call would
        return fn, base
    except Exception as e:  # noqa: BLE001 - every child reports it; the host raises it as the config's error
        return describe(e, limit=1000)


# ---------------------------------------------------------------- the worker's side


class AgentProcesses:
    """The worker's agent programs: one confined child per trajectory, killed with all it started when the
    trajectory ends."""

    def __init__(self, agent: str, isolation: str) -> None:
        self.agent = agent
        self.sandboxed = isolation == "sandbox"
        if self.sandboxed:
            _check_sandbox()
        self.children = Children("sandbox" if self.sandboxed else "limits", AGENT_LIMITS)
        module = "" if agent.startswith(BY_VALUE) else agent.partition(":")[0]
        self.preload = [m for m in (*CLIENT_MODULES, __name__, module) if m]

    async def run(self, row: dict, base_url: str, key: str, timeout_s: float) -> Outcome:
        """Run the program on `row` against the endpoint at `base_url` with API key `key`; its start (the
        zygote's imports the first time) is not its time."""
        tmpdir = None if self.sandboxed else tempfile.mkdtemp(prefix="agentrl-agent-")
        bridge = await Bridge.open(*_address(base_url)) if self.sandboxed else None
        child = None
        late = f"the agent's process did not start within {ZYGOTE_START_S:g} s"
        try:
            try:
                child = await asyncio.wait_for(self.children.spawn(AgentSpec(self.agent), self.preload), ZYGOTE_START_S)
            except TimeoutError:
                return Outcome(None, late)
            except EnvError as e:
                return Outcome(None, f"the agent's process did not start: {e}")
            try:
                status, detail, _ = await asyncio.wait_for(read_reply(child.reader, _WHO), ZYGOTE_START_S)
            except TimeoutError:
                return Outcome(None, late)
            except (EOFError, ConnectionError, ValueError) as e:
                await child.died(e)
                return Outcome(None, f"the agent's process did not start: {child.gone}")
            if status != "ok":
                raise RuntimeError(f"env.agent {self.agent[:200]!r} cannot be loaded: {detail}")
            url = SANDBOX_BASE_URL if bridge else base_url
            request = {"row": row, "base_url": url, "key": key, "timeout_s": timeout_s, "tmpdir": tmpdir}
            child.writer.write(frame(pickle.dumps({**request, "uds": bridge and str(bridge.path)})))
            try:
                await child.writer.drain()
                answer = await asyncio.wait_for(read_reply(child.reader, _WHO), timeout_s)
            except TimeoutError:
                return Outcome(None, f"agent still running after env.agent_timeout_s={timeout_s}s: killed")
            except (EOFError, ConnectionError):
                await child.died(EOFError())
                return Outcome(None, f"agent process ended without an answer ({child.gone})")
            except ValueError as e:
                return Outcome(None, str(e))
            return _outcome(answer)
        finally:
            if child is not None:  # everything it started, wherever it went; its uid or slot is then free
                await asyncio.shield(child.kill("its trajectory ended"))
            if bridge is not None:
                bridge.close()
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)


def _address(base_url: str) -> tuple[str, int]:
    where = urlsplit(base_url)
    return where.hostname, where.port


def _outcome(answer: list) -> Outcome:
    """What the child answered, checked: a program that writes to its socket itself gets no other answer through."""
    status, value, _ = answer
    if status == "ok" and (value is None or _number(value)):
        return Outcome(None if value is None else float(value), "")
    if status == "ok" and isinstance(value, dict) and set(value) == {"reward", "parts"} and _number(value["reward"]):
        parts = value["parts"]
        if isinstance(parts, dict) and all(isinstance(k, str) and _number(v) for k, v in parts.items()):
            return Outcome(float(value["reward"]), "", {k: float(v) for k, v in parts.items()})
    if status == "error" and isinstance(value, str):
        return Outcome(None, value[:2000])
    return Outcome(None, "the agent's process sent something that is not an answer")


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _check_sandbox() -> None:
    if os.geteuid() != 0:
        raise RuntimeError(
            "env.isolation=sandbox needs root on the rollout workers' nodes to confine env.agent programs (a uid "
            f"per trajectory, namespaces, cgroups); this process runs as uid {os.geteuid()}. Use env.isolation=auto "
            "there, or run the workers as root"
        )
    missing = [m for m in Layers.probe(False).missing if not m.startswith("no cgroup")]
    if missing:
        raise RuntimeError("env.isolation=sandbox cannot confine env.agent programs here: " + "; ".join(missing))
    if not Layers.probe(False).cgroup:
        warn_once("no cgroup for env.agent programs: their processes are not bounded together")


class AgentRunner:
    """The rollouts of one worker whose trajectories are agent programs."""

    def __init__(self, endpoint: Endpoint, env_cfg: EnvConfig, cfg: RolloutConfig, reward_cfg: RewardConfig, funcs):
        self.endpoint, self.env_cfg, self.cfg, self.reward_cfg, self.funcs = endpoint, env_cfg, cfg, reward_cfg, funcs
        self.processes = AgentProcesses(env_cfg.agent, env_cfg.isolation)
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
            # The program's API key is a secret: the trajectory's key (prompt and sample) is guessable, and a call
            # made with it would count against (and be trained as) another trajectory. The session keeps the
            # trajectory's key as its name: seeds and logs come from it.
            secret = f"agentrl-{secrets.token_urlsafe(24)}"
            session = self.endpoint.open(secret, temperature, seed)
            session.key = key
            try:
                timeout_s = self.env_cfg.agent_timeout_s
                return session, await self.processes.run(row, self.endpoint.base_url, secret, timeout_s)
            finally:
                self.endpoint.finish(secret)

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
                r, p = o.reward, {"agent": o.reward, **{f"agent/{k}": v for k, v in o.parts.items()}}
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
        broken = next(
            (
                f"sequence {i + 1} of {len(sequences)}: {b}"
                for i, q in enumerate(sequences)
                if (b := q.continuity_break())
            ),
            "",
        )
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
            continuity_break=broken,
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
