"""verifiers environments (the classic API of `verifiers` 0.3.1: `SingleTurnEnv`, `ToolEnv`, `MultiTurnEnv`, their
`Rubric`), unchanged: their own rollout loop runs as an agent program against our OpenAI-compatible endpoint.

    data:
      train: verifiers:my_env:load_environment            # the environment's dataset (its eval_dataset for eval)
      eval: verifiers:my_env:load_environment
    env:
      agent: agentrl_ray.envs.adapters.verifiers:run       # its rollout, as the program of each trajectory
    reward:
      functions: [env_reward]                              # unused: the rubric's reward is the program's

A verifiers environment drives its own loop (the model's turn, `env_response`, its stop conditions) through a
`Client`; here that client is verifiers' own `OpenAIChatCompletionsClient` around the `openai` client the endpoint
gives each trajectory (`rollout/endpoint/agents.py`), so every model call is one of ours: rendered by the model's
chat template with the environment's tools, sampled by our engine, trained on token for token, the program
contained at `env.isolation`. Then its rubric scores the state: the weighted sum is the trajectory's reward and each
function's value a reward part (`agent/<name>`; `agent/vf_error` is 1 where verifiers stopped the rollout with an
error, e.g. an empty answer: scored on what it did, as verifiers scores it).

- **Rows.** `verifiers:pkg.mod:fn` as a data source (`data.verifiers_rows`) calls `fn()` (the environment's
  `load_environment`) and takes its dataset (train) or eval dataset (eval; verifiers falls back to the train set);
  each row keeps its columns (`prompt` as messages, `answer`, `info`, `task`, `example_id`) and names its environment
  (`verifiers_env`), which `run` loads once per process.
- **Sampling.** The environment's `sampling_args` are passed on; our endpoint then caps `max_tokens` by
  `rollout.max_tokens_per_turn`, and `rollout.max_turns` bounds the calls.
- Only the classic API: the v1 tasksets (0.4.0) need `openai<3` against our openai-agents pin (docs/environments.md).
"""

from __future__ import annotations

import functools
from typing import Any

from agentrl_ray.data import VERIFIERS_ENV_COLUMN
from agentrl_ray.envs.loading import import_object

INSTALL = (
    "pip install --no-deps verifiers==0.3.1 plus the packages make install names (its declared pins conflict with "
    "ours: mcp<2 against vLLM CPU's mcp>=2)"
)


@functools.cache
def load(spec: str) -> Any:
    """The environment `spec` ("pkg.mod:load_environment") returns, once per process."""
    try:
        import verifiers  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"verifiers environments need the verifiers package: {INSTALL}") from None
    return import_object(spec, "verifiers environment loader")()


async def run(client: Any, row: dict[str, Any]) -> dict[str, Any]:
    """One trajectory: the environment's own rollout through our endpoint, scored by its rubric."""
    from verifiers.legacy.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    env = load(row[VERIFIERS_ENV_COLUMN])
    example = {"prompt": row["prompt"], "example_id": row.get("example_id", 0)}
    example.update({k: row[k] for k in ("answer", "info", "task") if row.get(k) is not None})
    state = await env.rollout(example, OpenAIChatCompletionsClient(client), "policy", dict(env.sampling_args or {}))
    # A rollout verifiers stopped with an error (the model answered nothing, a tool raised a stop error) is scored on
    # what it did, as verifiers scores it: the policy's fault is a low reward, not a lost trajectory.
    await env.rubric.score_rollout(state)
    parts = {k: float(v) for k, v in (state.get("metrics") or {}).items()}
    parts["vf_error"] = float(state.get("error") is not None)
    return {"reward": float(state["reward"]), "parts": parts}
