"""The learner's Ray Train trainer (agentrl_ray/infra/ray_train.py) on a real local Ray: the torch process group
that `ProcessGroupConfig` sets up works across ranks, and Ray Train's controller process stays free of torch."""

from __future__ import annotations

import ray
import ray.train

from agentrl_ray.infra.ray_train import ProcessGroupConfig, torch_trainer


def test_process_group_across_ranks_and_a_controller_without_torch(local_ray, tmp_path):
    def ranks(_config):  # defined here so that it pickles by value (workers cannot import this test)
        import os

        import torch
        import torch.distributed as dist

        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        controllers = [
            a["Pid"]
            for a in ray._private.state.actors().values()
            if a["ActorClassName"] == "TrainController" and a["State"] == "ALIVE"
        ]
        maps = [open(f"/proc/{pid}/maps").read() for pid in controllers]  # the controller runs on the driver's node
        return {
            "sum": total.item(),
            "backend": dist.get_backend(),
            "env": env,
            "controllers": len(maps),
            "controller_maps_torch": any("libtorch" in m for m in maps),
        }

    trainer = torch_trainer()(
        ranks,
        torch_config=ProcessGroupConfig(backend="gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path), name="process_group"),
    )
    result = trainer.fit()
    assert result.error is None
    m = result.return_value  # rank 0's
    assert m["sum"] == 3.0  # ranks 0 and 1 contributed 1 and 2: every rank joined the one group
    assert m["backend"] == "gloo"
    assert m["env"]["RANK"] == "0" and m["env"]["WORLD_SIZE"] == "2" and m["env"]["LOCAL_RANK"] == "0"
    assert m["controllers"] == 1
    # Ray's own TorchConfig unpickles in the controller by importing torch (~180 MiB of RSS more there).
    assert m["controller_maps_torch"] is False
