"""`agentrl-ray plan CONFIG [overrides] [--nodes JSON] [--json]`: print the placement plan without training.

    agentrl-ray plan examples/calculator/config.yaml profile=gpu --nodes '[{"count": 4, "CPU": 96, "GPU": 8}]'
    RAY_ADDRESS=auto agentrl-ray plan examples/calculator/config.yaml profile=gpu     # the cluster you are on

The nodes come from `--nodes` (a cluster you plan for, see `placement.nodes_from_spec`), else from the Ray cluster
at RAY_ADDRESS, else from this machine (what `agentrl-ray train` would start locally).
"""

from __future__ import annotations

import json
import os

from agentrl_ray.config import Config
from agentrl_ray.infra.placement import Node, Plan, make_plan, nodes_from_spec


def cluster_nodes(spec: str | None) -> list[Node]:
    if spec:
        return nodes_from_spec(spec)
    if os.environ.get("RAY_ADDRESS"):
        import ray

        from agentrl_ray.infra.placement import nodes_from_ray

        ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
        try:
            return nodes_from_ray(ray.nodes())
        finally:
            ray.shutdown()
    from agentrl_ray.infra.profiles import detect_hardware

    hw = detect_hardware()  # no cluster joined: the local Ray that `train` would start is this machine
    return [Node("local", float(hw.cpus), float(hw.gpus), head=True)]


def show(cfg: Config, spec: str | None, as_json: bool) -> Plan:
    plan = make_plan(cluster_nodes(spec), cfg)
    print(json.dumps(plan.to_dict(), indent=2) if as_json else plan.describe())
    return plan
