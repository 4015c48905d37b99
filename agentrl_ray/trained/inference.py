"""A trained checkpoint served the way training rolls out: the run's own config, rollout worker, agent loop and env.

`agentrl-ray eval`, `agentrl-ray chat` and the Python API's `generate` all go through `Agent`: a `RolloutPool`
(vLLM engines + env actors, on the local Ray or the cluster at RAY_ADDRESS) built from the run's `config.json`
with the checkpoint's weights. A LoRA checkpoint is merged into its base first, with the very merge the rollout
workers apply during training (`sync.lora.merge_lora`), so the engines hold the weights they sampled with, and
the same temperature and seed reproduce the run's held-out evaluation.

    with Agent.load("runs/calculator") as agent:
        result = agent.sample([{"id": "q", "prompt": "What is 347 * 29?"}], samples=1, temperature=0.0, seed=0)
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from agentrl_ray.chat_format import prompt_messages
from agentrl_ray.config import Config, RewardConfig
from agentrl_ray.messages import to_openai
from agentrl_ray.trained.checkpoints import Checkpoint, find_checkpoint, write_merged
from agentrl_ray.types import Trajectory, TrajectoryGroup


class Agent:
    def __init__(self, cfg: Config, model_path: str, checkpoint: Checkpoint | None = None, tmp=None) -> None:
        from agentrl_ray.infra import console
        from agentrl_ray.infra.local_ray import init_ray
        from agentrl_ray.infra.threads import ThreadPolicy
        from agentrl_ray.rollout.pool import RolloutPool

        self.cfg, self.model_path, self.checkpoint = cfg, model_path, checkpoint
        self._tmp = tmp  # the merged LoRA model's folder, removed at close()
        threads = ThreadPolicy.of(cfg)  # the run's own policy, as its driver decided it
        init_ray(cfg, threads, log_file=str(console.log_file() or "") or None)
        self.pool = RolloutPool.create(cfg, model_path, threads)

    @classmethod
    def load(cls, checkpoint: str | Path, *, rewards: bool = True, num_workers: int | None = None) -> Agent:
        """Serve `checkpoint` (a checkpoint folder, or a run folder: its newest). `rewards=False` skips the
        run's reward functions (a chat has no reference answer to score against)."""
        from agentrl_ray.builtin.resolve import resolve_model

        ckpt = find_checkpoint(checkpoint)
        cfg = ckpt.config()
        if not rewards:
            cfg.reward = RewardConfig(functions=[], weights=[])
        if num_workers is not None:
            cfg.rollout = dataclasses.replace(cfg.rollout, num_workers=num_workers)
        tmp = None
        if ckpt.is_lora:
            tmp = tempfile.TemporaryDirectory(prefix="agentrl-merged-")
            model = write_merged(ckpt, resolve_model(cfg.model.path), Path(tmp.name))
        else:
            model = ckpt.weights
        try:
            return cls(cfg, str(model), ckpt, tmp)
        except BaseException:
            if tmp is not None:
                tmp.cleanup()
            raise

    def sample(self, rows: list[dict[str, Any]], samples: int, temperature: float, seed: int) -> list[TrajectoryGroup]:
        """`samples` trajectories per row, in row order, exactly as a training step or evaluation samples them."""
        groups, _ = self.pool.sample(rows, samples, temperature, seed)
        return groups

    def close(self) -> None:
        self.pool.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- transcripts


def transcript(row: dict[str, Any], traj: Trajectory, cfg: Config) -> dict[str, Any]:
    """One JSONL record: the row's id and answer, the outcome, and the whole conversation, OpenAI-style."""
    return {
        "id": traj.prompt_id,
        "sample": traj.sample_index,
        "reward": traj.reward,
        "success": traj.reward >= cfg.run.success_threshold,
        "finish_reason": traj.finish_reason,
        "tool_calls": traj.num_tool_calls,
        "tool_errors": traj.num_tool_errors,
        **({"answer": row["answer"]} if "answer" in row else {}),  # the column answer_match reads
        "messages": to_openai(prompt_messages(row["prompt"], cfg.rollout.system_prompt) + traj.completion_messages),
    }
