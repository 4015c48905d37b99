"""`agentrl-ray chat CHECKPOINT`: talk to a trained agent in the terminal, with its tools.

    agentrl-ray chat runs/calculator                  # greedy; --temperature 1.0 to sample
    agentrl-ray chat runs/calculator --system "You are terse."

Every message goes through `inference.Agent`, i.e. the run's rollout worker, agent loop and environment on vLLM:
the model may call tools (each call and its result is shown) until it answers. The conversation so far (tool
calls and results included) is the next prompt. /reset starts over, /quit (or Ctrl-D) leaves.

The screen shows only the conversation: what Ray, vLLM and torch print goes to the run folder's chat_log.txt
(infra/console.py); --verbose shows it here.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl_ray.trained.inference import Agent

PROMPT = "you> "


def show(messages: list[dict[str, Any]], out=sys.stdout) -> None:
    """Print one reply: the tool calls, their results, and the answer. A text of several lines keeps its lines
    under its label (indented), so that every line on screen says whose it is."""
    from agentrl_ray.messages import to_openai

    for m in to_openai(messages):
        if m["role"] == "assistant":
            for call in m.get("tool_calls", []):
                fn = call["function"]
                print(f"  [tool call] {fn['name']}({fn['arguments']})", file=out)
            if m["content"] or not m.get("tool_calls"):
                print(f"agent> {_indented(m['content'])}", file=out)
        elif m["role"] == "tool":
            print(f"  [tool result] {_indented(m['content'])}", file=out)
        else:  # a turn-based environment's reply
            print(f"  [{m['role']}] {_indented(m['content'])}", file=out)
    out.flush()


def _indented(text: str) -> str:
    return "\n       ".join((text or "").split("\n"))


def session(agent: Agent, *, temperature: float, seed: int, system: str | None, read=input, out=sys.stdout) -> None:
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    turn = 0
    while True:
        try:
            line = read(PROMPT).strip()
        except EOFError:
            print(file=out)
            return
        if line in ("/quit", "/exit"):
            return
        if line == "/reset":
            history = history[:1] if system else []
            print("(conversation cleared)", file=out)
            continue
        if not line:
            continue
        prompt = [*history, {"role": "user", "content": line}]
        try:
            (group,) = agent.sample([{"id": f"chat-{turn}", "prompt": prompt}], 1, temperature, seed + turn)
        except ValueError as e:  # e.g. the conversation outgrew rollout.max_total_tokens
            print(f"error: {e} (/reset to start over)", file=out)
            continue
        traj = group.trajectories[0]
        show(traj.completion_messages, out)
        if traj.finish_reason not in ("answer", "done"):
            print(f"  (stopped: {traj.finish_reason})", file=out)
        history = prompt + traj.completion_messages
        turn += 1


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint_NNNNNN folder, or a run folder (its newest checkpoint)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", help="a system message (default: the run's rollout.system_prompt)")
    p.add_argument("-v", "--verbose", action="store_true", help="show Ray's, vLLM's and torch's output here")


def main(args) -> int:
    from agentrl_ray.infra import console
    from agentrl_ray.trained.checkpoints import find_checkpoint
    from agentrl_ray.trained.inference import Agent

    log = find_checkpoint(args.checkpoint).run_dir / "chat_log.txt"  # a bad path: one line, before anything starts
    with contextlib.nullcontext() if args.verbose else console.quiet(log, "Ray, vLLM and torch"):
        with Agent.load(args.checkpoint, rewards=False, num_workers=1) as agent:
            out = console.out()
            tools = [t["function"]["name"] for t in _tools(agent)]
            print(
                f"chatting with {agent.checkpoint.path} (tools: {', '.join(tools) or 'none'}); /reset, /quit", file=out
            )
            session(agent, temperature=args.temperature, seed=args.seed, system=args.system, read=_reader(out), out=out)
    return 0


def _reader(out):
    """`input()` that prompts on `out` (our terminal: descriptor 1 may point at the log file)."""

    def read(prompt: str) -> str:
        out.write(prompt)
        out.flush()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line

    return read


def _tools(agent: Agent) -> list[dict]:
    from agentrl_ray.envs.loading import env_class
    from agentrl_ray.envs.tools import tool_schemas

    return tool_schemas(env_class(agent.cfg.env.name, agent.cfg.env.tool_specs()))
