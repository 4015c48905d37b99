"""The Python API: `agentrl_ray.train(...)`, the CLI's training from a notebook or a script.

    import agentrl_ray

    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression and return the result.

        Args:
            expression: The expression to evaluate, e.g. "(347 * 29) - 12.5".
        '''
        ...

    result = agentrl_ray.train(model="builtin:tiny", tools=[calculator], data="builtin:arithmetic",
                               rewards=["answer_match"], run={"steps": 20})
    result.metrics["eval/success"], result.generate(["What is 347 * 29?"]), result.export("gguf")

It builds the same typed `Config` as `agentrl-ray train` (a YAML file, then these arguments, then dotted overrides)
and runs the same driver. Functions and classes become config strings (`envs.loading.object_spec`): their import path
when they have one (as a YAML config would name them), else the object itself pickled by value, so a tool defined
in a notebook or in the script that `ray job submit` runs reaches every Ray worker. Rows given as a list are
written to the run folder as JSONL, and the config points at that file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_ray.config import Config, deep_merge


def train(
    model: str | None = None,
    *,
    env: type | str | None = None,
    agent: Callable | str | None = None,
    tools: list[Callable | str] | None = None,
    system_prompt: str | None = None,
    data: str | list[dict[str, Any]] | None = None,
    eval_data: str | list[dict[str, Any]] | None = None,
    rewards: list[Callable | str] | None = None,
    reward_weights: list[float] | None = None,
    config: str | Path | dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    **sections: dict[str, Any],
) -> TrainResult:
    """Train and return a `TrainResult`. The arguments are those of `build_config`."""
    return run(
        build_config(
            model,
            env=env,
            agent=agent,
            tools=tools,
            system_prompt=system_prompt,
            data=data,
            eval_data=eval_data,
            rewards=rewards,
            reward_weights=reward_weights,
            config=config,
            overrides=overrides,
            **sections,
        )
    )


def build_config(
    model: str | None = None,
    *,
    env: type | str | None = None,
    agent: Callable | str | None = None,
    tools: list[Callable | str] | None = None,
    system_prompt: str | None = None,
    data: str | list[dict[str, Any]] | None = None,
    eval_data: str | list[dict[str, Any]] | None = None,
    rewards: list[Callable | str] | None = None,
    reward_weights: list[float] | None = None,
    config: str | Path | dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    **sections: dict[str, Any],
) -> Config:
    """The validated `Config` of a `train(...)` call (rows given as lists are written to the run folder).

    Args:
        model: `builtin:tiny`, a local Hugging Face folder or a Hub model id (`model.path`).
        env: an environment class (or its import path); with `tools` and no `env`, the tools are the whole env.
        agent: an agent program, `async def run(client, row)` against OpenAI's API, or its import path
            (`env.agent`, docs/openai_agent.md); it replaces `env`.
        tools: plain functions (or import paths) given to the agent as tools; the JSON schema comes from each
            function's signature and docstring.
        system_prompt: a system message before every prompt (`rollout.system_prompt`).
        data: training rows (dicts with a `prompt`), or a dataset spec (`builtin:arithmetic`, a .jsonl file, ...).
        eval_data: held-out rows or spec (default: `data`'s spec; rows given as a list are also used for eval).
        rewards: reward functions (TRL's signature) or built-in names / import paths; `reward_weights` default 1.
        config: a YAML file or a nested dict, applied first (like the CLI's CONFIG.yaml).
        overrides: dotted overrides applied last, as on the command line: ["run.steps=5", "learner.lr=1e-5"].
        **sections: config sections as dicts, e.g. run={"steps": 20}, learner={"lr": 1e-4}.
    """
    from agentrl_ray.config import load_yaml
    from agentrl_ray.envs.loading import object_spec
    from agentrl_ray.infra.profiles import load_config

    values: dict[str, Any] = load_yaml(config) if isinstance(config, (str, Path)) else dict(config or {})
    values = deep_merge(values, sections)
    given: dict[str, dict[str, Any]] = {}
    if model is not None:
        given.setdefault("model", {})["path"] = model
    if env is not None:
        given.setdefault("env", {})["name"] = env if isinstance(env, str) else object_spec(env, "environment")
    if agent is not None:
        given.setdefault("env", {})["agent"] = agent if isinstance(agent, str) else object_spec(agent, "env.agent")
    if tools is not None:
        given.setdefault("env", {})["tools"] = [t if isinstance(t, str) else object_spec(t, "tool") for t in tools]
        if env is None:
            given["env"]["name"] = ""
    if system_prompt is not None:
        given.setdefault("rollout", {})["system_prompt"] = system_prompt
    if rewards is not None:
        given["reward"] = {
            "functions": [r if isinstance(r, str) else object_spec(r, "reward function") for r in rewards],
            "weights": list(reward_weights) if reward_weights is not None else [1.0] * len(rewards),
        }
    for key, spec in (("train", data), ("eval", eval_data if eval_data is not None else data)):
        if isinstance(spec, str):
            given.setdefault("data", {})[key] = spec
    cfg = load_config(None, overrides, deep_merge(values, given))
    for key, rows in (("train", data), ("eval", eval_data if eval_data is not None else data)):
        if isinstance(rows, list):
            setattr(cfg.data, key, str(_write_rows(rows, cfg.run_dir / "data" / f"{key}.jsonl")))
    return cfg


def run(cfg: Config) -> TrainResult:
    """Train from a ready config (what `train` and `agentrl-ray train` both end in)."""
    from agentrl_ray.driver import train as drive

    metrics = drive(cfg)
    return TrainResult(cfg, metrics)


def _write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, row in enumerate(rows):
            try:
                f.write(json.dumps(row) + "\n")
            except TypeError as e:
                raise ValueError(f"data row {i} cannot be written as JSON: {e}") from None
    return path


@dataclass
class TrainResult:
    """What a training run gives back: its config, final metrics and outputs, and ways to use the model."""

    config: Config
    metrics: dict[str, Any]
    _agent: Any = field(default=None, repr=False)

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl (one per step, eval/ keys where an evaluation ran)."""
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    @property
    def checkpoint(self) -> Path:
        from agentrl_ray.trained.checkpoints import find_checkpoint

        return find_checkpoint(self.run_dir).path

    @property
    def model_path(self) -> Path:
        """The final weights: a Hugging Face model folder, or for LoRA the adapter folder (`save` merges it)."""
        from agentrl_ray.trained.checkpoints import find_checkpoint

        return find_checkpoint(self.run_dir).weights

    def generate(
        self, prompts: list[str | list[dict[str, str]]], *, temperature: float = 0.0, seed: int = 0
    ) -> list[list[dict[str, Any]]]:
        """Run the agent (vLLM, the run's tools and environment) on each prompt; returns each conversation's
        completion as OpenAI-style messages (the last one is the answer). The engines stay up until `close()`."""
        from agentrl_ray.messages import to_openai
        from agentrl_ray.trained.inference import Agent

        if self._agent is None:
            self._agent = Agent.load(self.run_dir, rewards=False)
        rows = [{"id": f"generate-{i}", "prompt": p} for i, p in enumerate(prompts)]
        groups = self._agent.sample(rows, 1, temperature, seed)
        return [to_openai(g.trajectories[0].completion_messages) for g in groups]

    def evaluate(self, **kwargs: Any) -> dict[str, Any]:
        """`agentrl-ray eval` on the final checkpoint (keyword arguments as `evaluate.evaluate_checkpoint`)."""
        from agentrl_ray.trained.evaluate import evaluate_checkpoint

        self.close()
        return evaluate_checkpoint(self.run_dir, **kwargs)

    def save(self, path: str | Path) -> Path:
        """The final model as a Hugging Face folder at `path` (LoRA merged into its base)."""
        return self.export("merged", path)

    def export(self, format: str, path: str | Path | None = None, quant: str = "q8_0") -> Path:
        """`agentrl-ray export`: "merged", "lora" or "gguf" (+ Ollama Modelfile)."""
        from agentrl_ray.trained.export import export

        return export(self.run_dir, format, path, quant)

    def close(self) -> None:
        """Stop the engines `generate` started."""
        if self._agent is not None:
            self._agent.close()
            self._agent = None
