"""The learner's Ray Train trainer (agentrl_ray/infra/ray_train.py) on a real Ray: the torch process group that
`ProcessGroupConfig` sets up joins every rank, Ray Train's controller process stays free of torch (its backend
config, and the learner's inputs passed by `loop_config`, which hold actor handles of torch classes), and Ray Train's
helper actors are left out exactly where the run started its own Ray (init_ray), kept on a Ray it did not start."""

from __future__ import annotations

import pytest
import ray
import ray.train

from agentrl_ray.infra.local_ray import init_ray, started_here
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.infra.ray_train import ProcessGroupConfig, loop_config, torch_trainer
from agentrl_ray.infra.threads import ThreadPolicy

pytestmark = pytest.mark.long

HELPERS = {"PlacementGroupCleaner", "_AutoscalingCoordinatorActor", "DatasetManager", "PreemptionWatcher"}


def _fit(tmp_path, name: str) -> dict:
    def ranks(config):  # defined here so that it pickles by value (workers cannot import this test)
        import os

        import torch
        import torch.distributed as dist

        from agentrl_ray.infra.ray_train import loop_inputs

        echo = ray.get(loop_inputs(config)["actor"].forward.remote(7))

        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]
        controllers = [a["Pid"] for a in alive if a["ActorClassName"] == "TrainController"]
        maps = [open(f"/proc/{pid}/maps").read() for pid in controllers]  # the controller runs on the driver's node
        return {
            "echo": echo,
            "sum": total.item(),
            "backend": dist.get_backend(),
            "env": env,
            "controllers": len(maps),
            "controller_maps_torch": any("libtorch" in m for m in maps),
            "actors": sorted({a["ActorClassName"] for a in alive}),
        }

    # An actor whose class lives in a module that imports torch, as the rollout pool's engines do: a handle loads its
    # class where it is unpickled, and the controller must not unpickle it (loop_config).
    import torch

    actor = ray.remote(num_cpus=0)(torch.nn.Identity).remote()
    trainer = torch_trainer()(
        ranks,
        train_loop_config=loop_config({"actor": actor}),
        torch_config=ProcessGroupConfig(backend="gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path), name=name),
    )
    result = trainer.fit()
    assert result.error is None
    m = result.return_value  # rank 0's
    assert m["echo"] == 7  # the inputs reached the rank
    assert m["sum"] == 3.0  # ranks 0 and 1 contributed 1 and 2: every rank joined the one group
    assert m["backend"] == "gloo"
    assert m["env"]["RANK"] == "0" and m["env"]["WORLD_SIZE"] == "2" and m["env"]["LOCAL_RANK"] == "0"
    assert m["controllers"] == 1
    # Ray's own TorchConfig unpickles in the controller by importing torch (~180 MiB of RSS more there).
    assert m["controller_maps_torch"] is False
    return m


@pytest.fixture
def fresh_ray():
    if ray.is_initialized():
        ray.shutdown()
    yield
    ray.shutdown()


def test_in_the_run_own_ray_the_helpers_are_left_out(fresh_ray, tmp_path):
    cfg = load_config(None, [])
    init_ray(cfg, ThreadPolicy.of(cfg))
    assert started_here()
    m = _fit(tmp_path, "own")
    assert "RayTrainWorker" in m["actors"] and "TrainController" in m["actors"], m["actors"]
    assert not HELPERS & set(m["actors"]), m["actors"]


def test_on_a_ray_the_run_did_not_start_the_helpers_stay(fresh_ray, tmp_path):
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    assert not started_here()
    m = _fit(tmp_path, "joined")
    # A cluster's autoscaler and a controller that dies while the cluster lives on still need them.
    assert {"PlacementGroupCleaner", "_AutoscalingCoordinatorActor"} <= set(m["actors"]), m["actors"]
    assert "DatasetManager" not in m["actors"]  # no Ray Dataset, anywhere
