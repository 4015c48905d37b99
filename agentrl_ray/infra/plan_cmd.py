"""`agentrl-ray plan CONFIG [overrides] [--nodes JSON] [--json] [--measured RUN_DIR]`: the placement plan, no training.

    agentrl-ray plan examples/calculator/config.yaml profile=gpu --nodes '[{"count": 4, "CPU": 96, "GPU": 8}]'
    RAY_ADDRESS=auto agentrl-ray plan examples/calculator/config.yaml profile=gpu     # the cluster you are on
    agentrl-ray plan examples/longtail/config.yaml sync.pipeline=stream --measured runs/probe

The nodes come from `--nodes` (a cluster you plan for, see `placement.nodes_from_spec`), else from the Ray cluster
at RAY_ADDRESS, else from this machine (what `agentrl-ray train` would start locally). With `--measured RUN_DIR` (a
finished batch-pipeline run of a few steps) it also prints the expected balance: each side's seconds a step on the
planned engines and learner ranks, each pipeline's step, and which side is the bottleneck (infra/balance.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def show(cfg: Config, spec: str | None, as_json: bool, measured: Path | None = None) -> Plan:
    plan = make_plan(cluster_nodes(spec), cfg)
    if measured is None:
        print(json.dumps(plan.to_dict(), indent=2) if as_json else plan.describe())
        return plan
    from agentrl_ray.infra.balance import describe, expected_balance, measured_costs

    costs = measured_costs(measured)
    engines, ranks = len(plan.engines), len(plan.learners)
    if as_json:
        print(json.dumps({**plan.to_dict(), "balance": expected_balance(costs, cfg, engines, ranks)}, indent=2))
    else:
        print(plan.describe() + "\n" + describe(costs, cfg, engines, ranks))
    return plan
