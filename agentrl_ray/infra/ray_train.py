"""Ray Train's TorchTrainer as a run uses it: less the per-fit processes a run has no use for.

- `torch_trainer()`: no Ray Data `DatasetManager` actor when no Ray Dataset is passed; in the local Ray a run
  starts for itself, no placement-group cleaner and no autoscaling coordinator either.
- `loop_config`/`loop_inputs`: the learner's inputs through the object store, past the controller.
- `ProcessGroupConfig`: the torch process group (gloo or NCCL) set up as Ray Train's `TorchConfig` does, from a
  module that does not import torch. Ray Train unpickles the backend config in its controller process, and Ray's
  `ray.train.torch.config` imports torch at its top: the controller, which never touches a tensor, then maps
  libtorch (384 against 203 MiB of RSS; docs/benchmarks.md). Here the controller's half (ask rank 0 for an address,
  start every rank's join, wait) is ours, and each rank runs Ray's own worker functions, imported on the worker.

Both lean on Ray Train's internals (`_create_default_callbacks`, `_initialize_and_run_controller`,
`FixedScalingPolicy`, `_setup_torch_process_group`, `_shutdown_torch`, `_set_torch_distributed_env_vars`); Ray is
pinned, and the Ray-tier tests train through both, on one node and on several.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

import ray
from ray._private import ray_constants
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
from ray.train.v2._internal.util import TrainingFramework

log = logging.getLogger("agentrl_ray")


@functools.cache
def torch_trainer():
    """Ray Train's TorchTrainer, less the helper actors a run has no use for. Each is a Python process importing Ray
    (~190-200 MiB of RSS, ~1-2 CPU-seconds while every role starts; docs/benchmarks.md).

    - Ray Data's `DatasetManager` (Ray Train 2.60 starts one for every fit, datasets or not), when no Ray Dataset is
      passed: the learner reads its prompts from the rollout pool, never `ray.train.get_dataset_shard` (which then
      fails, as for a dataset name that was not passed).
    - In the local Ray a run starts for itself (`local_ray.started_here`): the `PlacementGroupCleaner`, which
      removes the learner's placement group should the controller die while the Ray instance lives on (the local one
      ends with the run's driver), and the `_AutoscalingCoordinatorActor`, which asks a cluster's autoscaler for the
      learner's nodes (a local Ray has one node and no autoscaler). On a cluster both stay.

    `_create_default_callbacks` and `_initialize_and_run_controller` are Ray Train's own (Ray is pinned); tests check
    which actors a run starts and that it trains."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from agentrl_ray.infra.local_ray import started_here

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self):
            unused = (() if self.datasets else (DatasetsCallback,)) + (
                (PlacementGroupCleanerCallback,) if started_here() else ()
            )
            return [cb for cb in super()._create_default_callbacks() if not isinstance(cb, unused)]

        def _initialize_and_run_controller(self, **kwargs):
            if started_here() and type(kwargs.get("scaling_policy")) is FixedScalingPolicy:
                kwargs["scaling_policy"] = _LocalFixedScalingPolicy(self.scaling_config)
            return super()._initialize_and_run_controller(**kwargs)

    return Trainer


def loop_config(inputs: dict) -> dict:
    """`train_loop_config=` for the learner: its inputs as one object-store copy, fetched by `loop_inputs` on each
    rank. Ray Train's controller unpickles `train_loop_config` too, and the rollout pool's actor handles in it would
    load the engine's actor class there (and so torch: 386 against ~200 MiB); a large dataset would also be copied
    into the controller's arguments and every rank's."""
    return {"inputs": ray.put(inputs)}


def loop_inputs(config: dict) -> dict:
    """On a learner rank: the inputs `loop_config` stored."""
    return ray.get(config["inputs"])


# A healthy rank leaves its process group within a second. One that does not is stuck (a frozen process, or one
# inside a collective whose peer died), and Ray Train kills the group's processes right after this wait anyway, so
# the wait only delays the restart: Ray's own 30 s made a frozen learner's recovery take
# recovery.learner_unresponsive_s + 30 s (docs/reliability.md).
LEAVE_TIMEOUT_S = 5


@dataclass
class ProcessGroupConfig(BackendConfig):
    """`torch_config=` of the TorchTrainer: `torch.distributed` over `backend` ("gloo" on CPUs, "nccl" on GPUs),
    initialised from MASTER_ADDR/MASTER_PORT (rank 0's address), as Ray's `TorchConfig(init_method="env")`."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _ProcessGroupBackend

    @property
    def train_func_context(self):
        return _CudaDevice

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class _ProcessGroupBackend(Backend):
    """Runs in Ray Train's controller: everything that needs torch runs on the ranks."""

    share_cuda_visible_devices: bool = True  # every rank on a node sees the node's GPUs (NCCL needs its peers')

    def on_start(self, worker_group, backend_config: ProcessGroupConfig):
        addr, port = worker_group.execute_single(0, get_address_and_port)
        n = len(worker_group)
        # init_process_group blocks until every rank has joined, so all ranks start before any is waited for.
        joins = [
            worker_group.execute_single_async(
                rank, _join, addr, port, backend_config.backend, rank, n, backend_config.timeout_s
            )
            for rank in range(n)
        ]
        ray.get(joins)

    def on_shutdown(self, worker_group, backend_config: ProcessGroupConfig):
        """Every rank leaves its process group, waited for at most LEAVE_TIMEOUT_S (a value the user exported as
        TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S wins)."""
        leaves = worker_group.execute_async(_leave, len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, LEAVE_TIMEOUT_S)
        try:
            ray.get(leaves, timeout=timeout_s)
        except GetTimeoutError:
            log.warning("the learner's torch process group did not shut down within %d s", timeout_s)


def _join(addr: str, port: int, backend: str, rank: int, world: int, timeout_s: int) -> None:
    """On a rank: the torchrun-style environment (RANK, LOCAL_RANK, WORLD_SIZE, ...), then the process group."""
    from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group

    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    _set_torch_distributed_env_vars()
    _setup_torch_process_group(
        backend=backend, world_rank=rank, world_size=world, init_method="env://", timeout_s=timeout_s
    )


def _leave(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


class _LocalFixedScalingPolicy(FixedScalingPolicy):
    """Ray Train's fixed-size scaling policy without its autoscaler requests, and so without the coordinator actor
    that relays them: for a Ray with no autoscaler. It runs in the controller."""

    def after_controller_start(self, train_run_context) -> None:
        pass  # the base class creates the autoscaling coordinator's client (and the actor) here

    def _maybe_send_resource_request(self) -> None:
        pass


class _CudaDevice:
    """Around the training function on a rank: its GPU made current, as Ray's TorchConfig does."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc):
        return False
