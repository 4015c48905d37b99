"""An agent written with a framework from PyPI (the OpenAI Agents SDK: examples/openai_agent/sdk_agent.py) trains
unchanged against the endpoint, in a real run (real Ray, a vLLM engine, Ray Train) started as a user starts it:
`agentrl-ray train examples/openai_agent/config.yaml ...` from a fresh copy's root, no PYTHONPATH. The steps
complete, the learner trains on its calls, and the saved rollouts show its conversation (tool call, tool result,
answer) as chat messages.
The endpoint's unit tests run the torch backend; this run covers vLLM."""

import json

import pytest
from builders import TINY_RUN, as_a_user

from agentrl_ray.infra.profiles import load_config

pytest.importorskip("agents", reason="the OpenAI Agents SDK (the 'agent' extra)")
pytestmark = pytest.mark.long


def test_an_agents_sdk_program_trains_unchanged(builtin_model_path, fresh_copy):
    # As a user types it, from the root of a fresh copy, no PYTHONPATH: examples.openai_agent.* resolve from the
    # working directory on the driver and on every Ray worker (infra/user_code.py).
    extra = [
        "env.agent=examples.openai_agent.sdk_agent:run",
        "env.agent_timeout_s=180",  # its first step took 99 s beside a training on the 2 cores (14 s alone)
        "env.agent_processes=16",
        "run.steps=2",
        "run.save_rollouts=1",
        "sync.max_staleness=0",
        "run.output_dir=runs",
        "run.name=sdk",
    ]
    as_a_user(["agentrl-ray", "train", "examples/openai_agent/config.yaml", *TINY_RUN, *extra], fresh_copy)
    cfg = load_config(fresh_copy / "examples/openai_agent/config.yaml", [*TINY_RUN, *extra])
    run_dir = fresh_copy / "runs" / "sdk"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss/policy_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/sampled_tokens"] > 0 and r["rollout/env_tokens"] > 0 for r in steps)  # ECHO has tool text
    lines = [json.loads(x) for x in (run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(lines) == cfg.rollout.prompts_per_step * cfg.rollout.group_size
    conversations = [r["completion"] for r in lines]
    with_tools = [c for c in conversations if any(m["role"] == "tool" for m in c)]
    assert with_tools, "the warm-started model calls the calculator through the SDK"
    call = with_tools[0][0]["tool_calls"][0]
    assert call["function"]["name"] == "calculator" and "expression" in json.loads(call["function"]["arguments"])
    print("an SDK agent's conversation:", json.dumps(with_tools[0]))
    assert {r["finish_reason"] for r in lines} <= {"answer", "max_turns", "length"}  # none failed
