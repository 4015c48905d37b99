"""The placement plan: which engines, env hosts and learner ranks run on which node, computed once at start.

A pure function of (the cluster's nodes, the config): no Ray import, so it is unit-tested over declared clusters
(1x1, 1x8, 4x8 GPUs, mixed CPU/GPU nodes) and printed by `agentrl-ray plan` for a cluster the user does not have.
The driver turns it into Ray placement groups (`cluster.py`): one bundle per engine holding the env hosts packed
beside it, and the learner ranks as one group through Ray Train's ScalingConfig, every bundle pinned to the node
the plan chose. A cluster that cannot hold the plan fails here, before anything starts, naming what is missing.

Modes (`placement.mode`), when engines and learner both use GPUs:
- separate: every engine owns `rollout.tensor_parallel_size` whole GPUs, every learner rank one whole GPU.
- colocated: each GPU holds one engine and one learner rank, each asking Ray for half of it, so one GPU works.
  The halves are Ray's bookkeeping only: memory is shared through `rollout.gpu_memory_utilization` (0.35 by
  default here) and what the learner leaves. With `sync.max_staleness=0` the engine also sleeps between rollouts
  (vLLM sleep mode, level 1: `engine_modes.py`), handing its weights' and KV cache's memory to the learner step.
- auto: separate with >= 2 GPUs in the cluster, else colocated.
`rollout.num_workers=0` / `learner.num_workers=0` (the gpu profile) size the counts from the cluster's GPUs;
`env.num_actors=0` gives one env host per engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_ray.config import Config, ConfigError

COLOCATED_SHARE = 0.5  # of one GPU, for the engine and for the learner rank that share it
GPU_MEMORY = {"separate": 0.85, "colocated": 0.35}  # rollout.gpu_memory_utilization when left at 0
_NOT_CUSTOM = {"CPU", "GPU", "memory", "object_store_memory"}


class PlacementError(ConfigError):
    """The cluster cannot hold what the config asks for; the message says what is missing."""


@dataclass(frozen=True)
class Node:
    node_id: str
    cpus: float
    gpus: float
    custom: dict[str, float] = field(default_factory=dict)
    head: bool = False

    def capacity(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": self.gpus, **self.custom}


@dataclass(frozen=True)
class Slot:
    """One actor of the plan: its role, index (rank for learners), node, and the Ray resources it asks for."""

    role: str  # "engine" | "env" | "learner"
    index: int
    node_id: str
    resources: dict[str, float]
    bundle: int = -1  # index in the rollout placement group (engines and env hosts)


@dataclass
class Plan:
    mode: str  # "cpu" (no GPU anywhere), "separate" or "colocated"
    nodes: list[Node]
    engines: list[Slot]
    env_hosts: list[Slot]
    learners: list[Slot]
    bundles: list[tuple[str, dict[str, float]]]  # the rollout placement group: (node id, resources) per bundle
    tensor_parallel_size: int
    gpu_memory_utilization: float
    pipeline: str = ""  # the rollout/learner pipeline this plan runs, and what it means here (docs/async.md)

    def to_dict(self) -> dict[str, Any]:
        slots = {"engines": self.engines, "env_hosts": self.env_hosts, "learners": self.learners}
        return {
            "mode": self.mode,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            **{
                k: [{"index": s.index, "node": s.node_id, "resources": s.resources} for s in v]
                for k, v in slots.items()
            },
        }

    def describe(self) -> str:
        gpus, cpus = sum(n.gpus for n in self.nodes), sum(n.cpus for n in self.nodes)
        lines = [
            f"placement: mode={self.mode}, {len(self.nodes)} node(s), {gpus:g} GPU(s), {cpus:g} CPU(s); "
            f"{len(self.engines)} engine(s)"
            + (f" x {self.tensor_parallel_size} GPU(s) (tensor parallel)" if self.mode == "separate" else "")
            + ", "
            f"{len(self.env_hosts)} env host(s), {len(self.learners)} learner rank(s)"
        ]
        if self.pipeline:
            lines.append(f"pipeline: {self.pipeline}")
        for i, node in enumerate(self.nodes):
            parts = []
            for role, slots in (
                ("engine", self.engines),
                ("env host", self.env_hosts),
                ("learner rank", self.learners),
            ):
                mine = [s.index for s in slots if s.node_id == node.node_id]
                if mine:
                    parts.append(f"{role}s {_ranges(mine)}" if len(mine) > 1 else f"{role} {mine[0]}")
            used = _used(node.node_id, self.engines + self.env_hosts + self.learners)
            head = ", head" if node.head else ""
            lines.append(
                f"  node {i} ({node.node_id[:12]}{head}): CPU {used.get('CPU', 0):g}/{node.cpus:g} "
                f"GPU {used.get('GPU', 0):g}/{node.gpus:g} | {'; '.join(parts) or 'idle'}"
            )
        return "\n".join(lines)


def _ranges(ids: list[int]) -> str:
    return f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else ",".join(map(str, ids))


def _used(node_id: str, slots: list[Slot]) -> dict[str, float]:
    used: dict[str, float] = {}
    for s in slots:
        if s.node_id == node_id:
            for k, v in s.resources.items():
                used[k] = used.get(k, 0.0) + v
    return used


# ----------------------------------------------------------------------------------------------------------------
# Nodes: from Ray, or declared by the user


def nodes_from_ray(ray_nodes: list[dict[str, Any]]) -> list[Node]:
    """`ray.nodes()` → alive nodes, head first. Custom resources are everything but CPU/GPU/memory and Ray's own
    `node:*` / `accelerator_type:*` markers."""
    out = []
    for n in ray_nodes:
        if not n.get("Alive", False):
            continue
        res = n.get("Resources", {})
        custom = {
            k: float(v)
            for k, v in res.items()
            if k not in _NOT_CUSTOM and not k.startswith(("node:", "accelerator_type:"))
        }
        out.append(
            Node(
                node_id=n["NodeID"],
                cpus=float(res.get("CPU", 0)),
                gpus=float(res.get("GPU", 0)),
                custom=custom,
                head="node:__internal_head__" in res,
            )
        )
    return sorted(out, key=lambda n: not n.head)


def nodes_from_spec(spec: str) -> list[Node]:
    """A declared cluster: JSON (or a .json file) listing node kinds, e.g.
    `[{"count": 4, "CPU": 96, "GPU": 8}]` or `[{"CPU": 8, "head": true}, {"count": 2, "CPU": 32, "GPU": 4,
    "resources": {"big_mem": 1}}]`."""
    text = Path(spec).read_text() if spec.endswith(".json") else spec
    try:
        kinds = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(  # noqa: B904 - the JSON error is in the message
            f'--nodes: not JSON ({exc}): give a list such as \'[{{"count": 4, "CPU": 96, "GPU": 8}}]\''
        )
    if isinstance(kinds, dict):
        kinds = [kinds]
    nodes = []
    for i, kind in enumerate(kinds):
        unknown = set(kind) - {"count", "CPU", "GPU", "resources", "head"}
        if unknown or not isinstance(kind.get("count", 1), int):
            raise ConfigError(
                f"--nodes entry {i}: unknown keys {sorted(unknown)} (allowed: count, CPU, GPU, resources, head)"
            )
        for _ in range(kind.get("count", 1)):
            nodes.append(
                Node(
                    node_id=f"node{len(nodes)}",
                    cpus=float(kind.get("CPU", 0)),
                    gpus=float(kind.get("GPU", 0)),
                    custom={k: float(v) for k, v in kind.get("resources", {}).items()},
                    head=bool(kind.get("head", False)),
                )
            )
    return nodes


# ----------------------------------------------------------------------------------------------------------------
# The plan


def make_plan(nodes: list[Node], cfg: Config) -> Plan:
    if not nodes:
        raise PlacementError("the Ray cluster has no alive nodes")
    r, lc = cfg.rollout, cfg.learner
    total_gpus = sum(n.gpus for n in nodes)
    mode = _mode(cfg, total_gpus)
    engines, learners = _counts(cfg, mode, total_gpus)
    tp = r.tensor_parallel_size
    engine_gpus = {"cpu": 0.0, "separate": float(tp) if r.use_gpu else 0.0, "colocated": COLOCATED_SHARE}[mode]
    learner_gpus = {"cpu": 0.0, "separate": 1.0 if lc.use_gpu else 0.0, "colocated": COLOCATED_SHARE}[mode]
    engine_res = _res(r.num_cpus_per_worker, engine_gpus, r.resources)
    env_res = _res(cfg.env.num_cpus_per_actor, 0.0, cfg.env.resources)
    learner_res = _res(lc.num_cpus_per_worker, learner_gpus, lc.resources)
    hosts = cfg.env.num_actors or engines  # 0: one env host per engine
    wanted = [
        ("engine", engines, engine_res),
        ("env host", hosts, env_res),
        ("learner rank", learners, learner_res),
    ]
    _check_totals(nodes, wanted)

    free = {n.node_id: n.capacity() for n in nodes}
    engine_slots = [
        Slot("engine", i, _take(free, engine_res, nodes, f"engine {i}"), engine_res) for i in range(engines)
    ]
    env_slots = []
    for h in range(hosts):
        # Env hosts pack beside the engines (host h serves engine h % E first): tool calls stay on the node.
        prefer = engine_slots[h % engines].node_id if engine_slots else None
        env_slots.append(Slot("env", h, _take(free, env_res, nodes, f"env host {h}", prefer), env_res))
    learner_slots = [
        Slot("learner", k, _take(free, learner_res, nodes, f"learner rank {k}"), learner_res) for k in range(learners)
    ]
    engine_slots, env_slots, bundles = _bundles(engine_slots, env_slots)
    gpu_mem = r.gpu_memory_utilization or GPU_MEMORY.get(mode, 0.85)
    apart = not {s.node_id for s in engine_slots} & {s.node_id for s in learner_slots}
    return Plan(mode, nodes, engine_slots, env_slots, learner_slots, bundles, tp, gpu_mem, _pipeline(cfg, mode, apart))


def _pipeline(cfg: Config, mode: str, apart: bool) -> str:
    """What the pipeline means on this plan; `apart`: no node holds both an engine and a learner rank."""
    k = cfg.sync.max_staleness
    if cfg.sync.pipeline == "batch":
        return f"batch, k={k}: " + ("on-policy" if k == 0 else "step t+1 sampled while step t trains")
    if mode == "separate":
        where = "engines and learner on their own GPUs"
    elif apart:
        where = "engines and learner on separate nodes"
    else:
        where = "engines and learner share the nodes' cores: the update runs slower while the engines generate"
    return f"stream, k={k}: up to {max(k, 1)} steps of groups in flight, weights land between turns; {where}"


def _mode(cfg: Config, total_gpus: float) -> str:
    r, lc, mode = cfg.rollout, cfg.learner, cfg.placement.mode
    if not r.use_gpu and not lc.use_gpu:
        return "cpu"
    if total_gpus == 0:
        who = [k for k, v in (("rollout.use_gpu", r.use_gpu), ("learner.use_gpu", lc.use_gpu)) if v]
        raise PlacementError(
            f"{' and '.join(who)} ask for GPUs but no node of the Ray cluster has any: add GPU nodes, or use "
            "profile=cpu"
        )
    both = r.use_gpu and lc.use_gpu
    if mode == "auto" and both and total_gpus < 2 and cfg.sync.pipeline == "stream":
        raise PlacementError(
            "sync.pipeline=stream keeps the engines generating while the learner trains: on one GPU they would share "
            "it (placement colocated); use sync.pipeline=batch there, or a second GPU"
        )
    if mode == "auto":
        return "colocated" if both and total_gpus < 2 else "separate"
    if mode == "colocated":
        if not both:
            raise PlacementError(
                "placement.mode=colocated shares GPUs between engines and learner ranks: it needs "
                "rollout.use_gpu=true and learner.use_gpu=true"
            )
        if r.tensor_parallel_size > 1:
            raise PlacementError(
                "placement.mode=colocated gives each engine half of one GPU: it needs "
                "rollout.tensor_parallel_size=1 (use placement.mode=separate for tensor parallelism)"
            )
    return mode


def _counts(cfg: Config, mode: str, total_gpus: float) -> tuple[int, int]:
    """(engines, learner ranks); a 0 in the config means: as many as the cluster's GPUs allow."""
    engines, learners = cfg.rollout.num_workers, cfg.learner.num_workers
    tp = cfg.rollout.tensor_parallel_size
    gpus = int(total_gpus)
    if mode == "cpu":
        return engines or 1, learners or 1
    if mode == "colocated":
        return engines or gpus, learners or gpus
    r_gpu, l_gpu = cfg.rollout.use_gpu, cfg.learner.use_gpu
    if not learners:
        # Separate GPUs: half the cluster learns unless the engine count is given.
        if not l_gpu:
            learners = 1
        elif not r_gpu:  # engines on CPU: every GPU learns
            learners = gpus
        else:
            learners = max(1, gpus - engines * tp if engines else gpus // 2)
    if not engines:
        left = gpus - (learners if l_gpu else 0)
        engines = left // tp if r_gpu else 1
        if engines < 1:
            raise PlacementError(
                f"no GPUs left for an engine: the cluster has {gpus} GPU(s), the learner takes {learners} and an "
                f"engine needs rollout.tensor_parallel_size={tp}; lower learner.num_workers or "
                "use placement.mode=colocated"
            )
    return engines, learners


def _res(cpus: float, gpus: float, custom: dict[str, float]) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **custom}


def _fmt(res: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in res.items() if v)


def _check_totals(nodes: list[Node], wanted: list[tuple[str, int, dict[str, float]]]) -> None:
    """The whole ask against the whole cluster, so the error names the resource that is short overall."""
    have: dict[str, float] = {}
    for n in nodes:
        for k, v in n.capacity().items():
            have[k] = have.get(k, 0.0) + v
    need: dict[str, float] = {}
    for _, count, res in wanted:
        for k, v in res.items():
            need[k] = need.get(k, 0.0) + count * v
    short = {k: v for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        asks = "; ".join(f"{count} {role}(s) x [{_fmt(res)}]" for role, count, res in wanted if count)
        missing = ", ".join(f"{k}: needs {v:g}, cluster has {have.get(k, 0.0):g}" for k, v in short.items())
        raise PlacementError(
            f"the Ray cluster cannot hold this run ({missing}). The config asks for {asks}. Lower the counts "
            "(rollout.num_workers, env.num_actors, learner.num_workers) or the per-actor resources "
            "(*.num_cpus_per_*, rollout.tensor_parallel_size), or add nodes"
        )


def _take(free: dict[str, dict[str, float]], res: dict[str, float], nodes: list[Node], what: str, prefer=None) -> str:
    """First node (the preferred one first) with room for `res`; its free resources shrink."""
    order = sorted(free, key=lambda nid: nid != prefer) if prefer else list(free)
    for nid in order:
        if all(free[nid].get(k, 0.0) + 1e-9 >= v for k, v in res.items()):
            for k, v in res.items():
                free[nid][k] = free[nid].get(k, 0.0) - v
            return nid
    left = "; ".join(f"node {i} ({n.node_id[:12]}): {_fmt(free[n.node_id]) or 'nothing'}" for i, n in enumerate(nodes))
    hint = " (an engine's rollout.tensor_parallel_size GPUs must be on one node)" if "GPU" in res else ""
    raise PlacementError(
        f"no node has room for {what} [{_fmt(res)}] after the actors placed before it{hint}. Free per node: {left}"
    )


def _bundles(engines: list[Slot], hosts: list[Slot]) -> tuple[list[Slot], list[Slot], list[tuple[str, dict]]]:
    """One bundle per engine, holding the env hosts placed on its node that serve it; other hosts get their own."""
    bundles: list[tuple[str, dict[str, float]]] = []
    out_engines, out_hosts = [], list(hosts)
    for e in engines:
        res = dict(e.resources)
        for j, h in enumerate(out_hosts):
            if h.bundle < 0 and h.node_id == e.node_id and h.index % len(engines) == e.index:
                for k, v in h.resources.items():
                    res[k] = res.get(k, 0.0) + v
                out_hosts[j] = Slot(h.role, h.index, h.node_id, h.resources, len(bundles))
        out_engines.append(Slot(e.role, e.index, e.node_id, e.resources, len(bundles)))
        bundles.append((e.node_id, res))
    for j, h in enumerate(out_hosts):
        if h.bundle < 0:
            out_hosts[j] = Slot(h.role, h.index, h.node_id, h.resources, len(bundles))
            bundles.append((h.node_id, dict(h.resources)))
    return out_engines, out_hosts, bundles
