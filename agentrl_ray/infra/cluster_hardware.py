"""The hardware a run is sized for: the Ray cluster it runs on, not the machine that parses the config.

`profile=auto` (cpu or gpu) and the profiles' Ray CPU requests (`sizing.fit_cpu_requests`) read a `Hardware`.
When this process is connected to a Ray cluster, or pointed at one (`RAY_ADDRESS`, which `ray job submit` also sets
for the job's driver, or a `ray start` cluster running here: `local_ray.cluster_address`), that summary comes from
the cluster's alive nodes (`ray.nodes()`), not from `detect_hardware()`: a CPU-only head node that submits to a GPU
cluster gets the gpu profile, and a laptop driver does not size a cluster's actors by its own cores. Without a
cluster, or when the cluster is this machine alone (one node, at this machine's address: a local `ray.init()`, or
`ray start --head` here), this machine's own detection, which also knows the GPUs' memory and the cores this process
may use.

How a node list becomes one summary (`hardware_from_nodes`, a pure function):
- gpus: all GPUs of the cluster. They decide cpu vs gpu; how many engines and learner ranks use them is the
  placement plan's (`placement.py`), which sees every node.
- cpus and RAM: the largest node's. The CPU requests are shared out as if every actor ran on one node, so each
  request fits the largest node: never a request that no node can hold (the plan spreads the actors later).
- GPU names from Ray's `accelerator_type:*` markers; their memory is not in `ray.nodes()` (0: unknown).
"""

from __future__ import annotations

import sys
from typing import Any

from agentrl_ray.infra.hardware import GPUInfo, Hardware, detect_hardware

_GIB = 2**30


def hardware_from_nodes(ray_nodes: list[dict[str, Any]]) -> Hardware:
    """`ray.nodes()` → the Hardware that sizing and `profile=auto` read (see the module docstring)."""
    alive = [n.get("Resources", {}) for n in ray_nodes if n.get("Alive", False)]
    if not alive:
        raise ValueError("the Ray cluster has no alive nodes to size the run for")
    biggest = max(alive, key=lambda r: (r.get("CPU", 0), r.get("memory", 0)))
    devices = []
    for res in alive:
        kinds = [k.removeprefix("accelerator_type:") for k in res if k.startswith("accelerator_type:")]
        name = kinds[0] if kinds else "GPU"
        devices += [GPUInfo("nvidia", name, 0.0)] * int(res.get("GPU", 0))
    return Hardware(
        cpus=int(biggest.get("CPU", 0)),
        # Ray splits a node's memory into the task heap ("memory") and the object store: together about its RAM.
        ram_gib=(biggest.get("memory", 0) + biggest.get("object_store_memory", 0)) / _GIB,
        gpus=len(devices),
        gpu_devices=tuple(devices),
    )


def is_this_machine(ray_nodes: list[dict[str, Any]], ip: str) -> bool:
    """One alive node, at this machine's address."""
    alive = [n for n in ray_nodes if n.get("Alive", False)]
    return len(alive) == 1 and alive[0].get("NodeManagerAddress") == ip


def target_hardware() -> Hardware:
    """The Ray cluster this process is connected to or pointed at (RAY_ADDRESS), unless that is this machine alone;
    else this machine."""
    found = _cluster_nodes()
    if found is None or is_this_machine(*found):
        return detect_hardware()
    return hardware_from_nodes(found[0])


def _cluster_nodes() -> tuple[list[dict[str, Any]], str] | None:
    """(ray.nodes(), this machine's address as Ray sees it), or None without a cluster."""
    # Ray is imported only when a cluster is in play: parsing a config stays light otherwise.
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        ray = sys.modules["ray"]
        return ray.nodes(), ray.util.get_node_ip_address()
    from agentrl_ray.infra.local_ray import cluster_address

    address = cluster_address(quiet=True)
    if not address:
        return None
    import ray

    # A short connection just to read the nodes: the driver joins again later with its runtime environment.
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return ray.nodes(), ray.util.get_node_ip_address()
    finally:
        ray.shutdown()
