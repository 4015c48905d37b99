"""The placement plan on a live Ray cluster: read the nodes, reserve the plan's placement groups, hand out the
scheduling options of every actor and the learner's ScalingConfig.

Every bundle is pinned to the node the plan chose through Ray's built-in `ray.io/node-id` label (by excluding the
plan's other nodes, so that a lost node's bundles can move to its replacement: `pin`), so what runs where is the
plan's decision, not the scheduler's. Reserving waits at most `placement.timeout_s`: a cluster that
cannot hold the plan (another job took the resources, a node died since the plan was made) fails with the plan and
what is free, never hangs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from agentrl_ray.config import Config
from agentrl_ray.infra.placement import PlacementError, Plan, Slot, make_plan, nodes_from_ray

NODE_LABEL = "ray.io/node-id"
log = logging.getLogger("agentrl_ray")


@dataclass
class Reserved:
    """A plan whose rollout-side placement group Ray has reserved."""

    plan: Plan
    group: PlacementGroup

    def options(self, slot: Slot) -> dict[str, Any]:
        """`.options(...)` of the engine or env host actor `slot`: its resources, inside its bundle."""
        res = dict(slot.resources)
        return {
            "num_cpus": res.pop("CPU", 0.0),
            "num_gpus": res.pop("GPU", 0.0),
            "resources": res,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=slot.bundle, placement_group_capture_child_tasks=False
            ),
        }

    def engine_options(self) -> list[dict[str, Any]]:
        return [self.options(s) for s in self.plan.engines]

    def env_options(self) -> list[dict[str, Any]]:
        return [self.options(s) for s in self.plan.env_hosts]

    def release(self) -> None:
        remove_placement_group(self.group)


def plan_for_cluster(cfg: Config) -> Plan:
    """The plan for the cluster this process is connected to (sized from its nodes, not this machine)."""
    plan = make_plan(nodes_from_ray(ray.nodes()), cfg)
    gpus = sum(n.gpus for n in plan.nodes)
    if gpus and plan.mode == "cpu":  # profile=auto/lora decide from the driver's machine, which may have none
        log.warning(
            "the Ray cluster has %g GPU(s) and this run uses none (profile=%s): pass profile=gpu (or "
            "rollout.use_gpu=true learner.use_gpu=true) to use them",
            gpus,
            cfg.profile,
        )
    return plan


def apply_plan(cfg: Config, plan: Plan) -> None:
    """Write the plan's resolved counts back into the config every role receives (0 meant: from the cluster)."""
    samples = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if len(plan.learners) > samples:
        raise PlacementError(
            f"the plan has {len(plan.learners)} learner ranks but a step has only {samples} trajectories "
            "(rollout.prompts_per_step * rollout.group_size): every rank needs samples; set learner.num_workers"
        )
    one_gpu = plan.mode == "colocated" and len(plan.engines) == 1 and len(plan.learners) == 1
    if plan.mode == "colocated" and cfg.sync.transport == "collective":
        # NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), which is what a
        # colocated learner rank 0 and its engine are. On one GPU, CUDA IPC hands the weights over in place.
        cfg.sync.transport = "ipc" if one_gpu else "object_store"
        log.info("placement colocated: weight sync by %s (NCCL cannot pair ranks on one GPU)", cfg.sync.transport)
    if cfg.sync.transport == "ipc" and plan.mode != "cpu" and not one_gpu:
        raise PlacementError(
            f"sync.transport=ipc hands weights over on learner rank 0's GPU, so every engine must share it: this "
            f"plan ({plan.mode}) has {len(plan.engines)} engine(s) and {len(plan.learners)} learner rank(s); use "
            "sync.transport=object_store (colocated) or collective (separate)"
        )
    cfg.rollout.num_workers = len(plan.engines)
    cfg.env.num_actors = len(plan.env_hosts)
    cfg.learner.num_workers = len(plan.learners)
    if cfg.rollout.use_gpu:
        cfg.rollout.gpu_memory_utilization = plan.gpu_memory_utilization


def reserve(plan: Plan, timeout_s: float, name: str = "") -> Reserved:
    group = placement_group(
        [res for _, res in plan.bundles],
        strategy="PACK",
        name=name,
        bundle_label_selector=[pin(node_id, plan) for node_id, _ in plan.bundles],
    )
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        free = ray.available_resources()
        raise PlacementError(
            f"Ray did not reserve the rollout placement group within placement.timeout_s={timeout_s:g}s "
            f"(free in the cluster now: {_fmt(free)}); something else holds the resources the plan counted on, "
            f"or a node left. The plan:\n{plan.describe()}"
        )
    return Reserved(plan, group)


def pin(node_id: str, plan: Plan) -> dict[str, str]:
    """The label selector that holds a bundle (or learner rank) to its planned node: "none of the other nodes the
    plan saw", not "this node". While the cluster is as planned the two are the same; but when the node dies, Ray
    reschedules the bundle and restarts its actors (Ray Train its worker group) on a node that joined since, such
    as the replacement an autoscaler adds, where a selector naming the dead node could never be met again."""
    others = sorted(n.node_id for n in plan.nodes if n.node_id != node_id)
    return {NODE_LABEL: f"!in({','.join(others)})"} if others else {}


def check_nodes_see(root: str, model_folder: str | None, plan: Plan) -> None:
    """Refuse a plan whose other nodes do not see the driver's storage folder or model folder (storage.py)."""
    from agentrl_ray.infra.storage import blind_message, paths_to_check, write_marker

    here = ray.get_runtime_context().get_node_id()
    need = paths_to_check(
        root, model_folder, here, [s.node_id for s in plan.learners], [s.node_id for s in plan.engines]
    )
    if not need:
        return
    # The storage folder gets a fresh marker (the same path may exist on every node, holding different files); the
    # model folder, which may be read-only, is seen when its config.json is.
    markers = {root: write_marker(root)} if any(root in paths for paths in need.values()) else {}
    probe = {**{f: os.path.join(f, "config.json") for f in [model_folder] if f}, **markers}
    try:
        seen = ray.get(
            [
                _sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                    [str(probe[f]) for f in paths]
                )
                for node, paths in need.items()
            ],
            timeout=120,
        )
    finally:
        for marker in markers.values():
            marker.unlink()
    blind = {node: [f for f, ok in zip(paths, oks) if not ok] for (node, paths), oks in zip(need.items(), seen)}
    message = blind_message(root, model_folder, {n: f for n, f in blind.items() if f})
    if message:
        raise PlacementError(message)


def ensure_model_on_nodes(repo_id: str, snapshot: str, plan: Plan) -> None:
    """A Hub model's snapshot (one commit, resolved on the driver) at the same path on every node of the plan:
    nodes whose cache lacks it download that commit; a node whose cache lives elsewhere is an error."""
    import os
    from pathlib import Path

    here = ray.get_runtime_context().get_node_id()
    nodes = sorted({s.node_id for s in plan.engines + plan.learners} - {here})
    commit = Path(snapshot).name
    # The same cache folder and offline switch as the driver: the snapshot path must be the same on every node.
    env = {k: os.environ[k] for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT") if k in os.environ}
    paths = ray.get(
        [
            _fetch.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False), runtime_env={"env_vars": env}
            ).remote(repo_id, commit)
            for n in nodes
        ]
    )
    wrong = [f"{n[:12]}: {p}" for n, p in zip(nodes, paths) if p != snapshot]
    if wrong:
        raise PlacementError(
            f"model {repo_id}@{commit[:12]} is at {snapshot} on the driver but elsewhere on other nodes "
            f"({'; '.join(wrong)}): give every node the same HF_HUB_CACHE (e.g. a shared folder)"
        )


@ray.remote(num_cpus=0)
def _fetch(repo_id: str, commit: str) -> str:
    from agentrl_ray.infra.hub import fetch_commit

    return fetch_commit(repo_id, commit)


@ray.remote(num_cpus=0)
def _sees(paths: list[str]) -> list[bool]:
    import os

    return [os.path.exists(p) for p in paths]


def learner_scaling(plan: Plan, use_gpu: bool):
    """Ray Train's ScalingConfig for the plan's learner ranks: one placement group (Ray Train's own), each rank
    pinned to its planned node."""
    import ray.train

    res = dict(plan.learners[0].resources)
    return ray.train.ScalingConfig(
        num_workers=len(plan.learners),
        use_gpu=use_gpu,
        resources_per_worker=res,
        placement_strategy="PACK",
        label_selector=[pin(s.node_id, plan) for s in plan.learners],
    )


def _fmt(res: dict[str, float]) -> str:
    keep = {k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store_memory"))}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(keep.items())) or "nothing"
