"""Small shared builders of the test tiers: a minimal `Trajectory` and the overrides of a tiny training run.

`pytest` puts this folder on sys.path (it holds the root conftest.py), so test modules import it as `builders`."""

import os
import subprocess
import sys
from pathlib import Path

from agentrl_ray.types import Trajectory

# A 3-step-or-so default-task run on the built-in tiny model, checkpointing every step, no evaluation or plots:
# what the resume and chaos tests start from (each adds its own keys after these).
TINY_RUN = [
    "profile=cpu",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "data.train_size=64",
    "data.eval_size=8",
    "run.eval_samples=1",
    "run.eval_every=0",
    "run.eval_at_start=false",
    "run.checkpoint_every=1",
    "run.keep_checkpoints=0",
    "run.plot=false",
]


def trajectory(prompt_id: str = "p0", sample_index: int = 0, reward: float = 0.0, **fields) -> Trajectory:
    """A two-token trajectory (one prompt token, one action token); `fields` override any other field."""
    base = dict(
        token_ids=[1, 2],
        action_mask=[0, 1],
        env_mask=[0, 0],
        template_mask=[0, 0],
        rollout_logprobs=[0.0, -1.0],
        policy_version=0,
        finish_reason="answer",
        prompt_len=1,
    )
    return Trajectory(prompt_id=prompt_id, sample_index=sample_index, reward=reward, **{**base, **fields})


def hidden_from_sandbox(path) -> bool:
    """Whether a host path lies under a folder the sandbox replaces with its own private tmpfs (/tmp, /var/tmp,
    /dev/shm): a sandboxed write there fails as "not found", elsewhere as "permission denied". A checkout cloned
    under /tmp (as CI may do) is such a path."""
    from pathlib import Path

    return any(Path(path).resolve().is_relative_to(d) for d in ("/tmp", "/var/tmp", "/dev/shm"))


def fit_one_learner_worker(train_fn, loop_config: dict, storage: Path, *, name: str, use_gpu: bool = False):
    """`train_fn` in a 1-worker Ray Train TorchTrainer (NCCL on a GPU, else gloo); returns the Result, raising the
    worker's error. The module defining `train_fn` travels by value: Ray Train's workers cannot import test modules."""
    import ray.cloudpickle
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    module = sys.modules[train_fn.__module__]
    ray.cloudpickle.register_pickle_by_value(module)
    try:
        resources = None if use_gpu else {"CPU": 1}
        trainer = TorchTrainer(
            train_fn,
            train_loop_config=loop_config,
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=use_gpu, resources_per_worker=resources),
            run_config=ray.train.RunConfig(name=name, storage_path=str(storage)),
        )
        result = trainer.fit()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)
    if result.error is not None:
        raise result.error
    return result


def as_ray_train_rank_zero(monkeypatch, device) -> None:
    """This process as the only worker of a Ray Train group on `device` (what `Policy` asks `ray.train` for), so a
    learner `Policy` can be built in a test without a TorchTrainer."""
    import ray.train
    import ray.train.torch

    class RankZeroOfOne:
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 1

    monkeypatch.setattr(ray.train, "get_context", RankZeroOfOne)
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: device)


def cpu_policy(path: str, monkeypatch, *overrides: str):
    """The learner's real `Policy` on this process's CPU (DDP backend, `load_config` overrides after the cpu profile),
    seeded, with LoRA's B (which starts at 0) moved so that the adapter changes the output."""
    import torch

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.policy import Policy

    as_ray_train_rank_zero(monkeypatch, torch.device("cpu"))
    cfg = load_config(None, ["profile=cpu", "learner.backend=ddp", *overrides])
    torch.manual_seed(0)
    policy = Policy(path, cfg.model, cfg.learner, need_reference=False)
    for name, p in policy.module.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return policy


def as_a_user(cmd: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`agentrl-ray ...` (the installed console script) or `python ...` as a user types it in `cwd`: no PYTHONPATH,
    no RAY_ADDRESS (the run starts its own Ray). Fails the test on a non-zero exit, with the output's tail."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    exe = {"agentrl-ray": str(Path(sys.executable).parent / "agentrl-ray"), "python": sys.executable}[cmd[0]]
    res = subprocess.run([exe, *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, (cmd, res.stdout[-3000:], res.stderr[-3000:])
    return res
