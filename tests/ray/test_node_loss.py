"""A whole worker node lost during a real training run (real Ray, vLLM and Ray Train learner), as when a spot node
is reclaimed: the node that holds the rollout worker and the env host is killed (`Cluster.remove_node` without grace
kills its raylet and every process on it) while a step's rollout is out, and a replacement node joins, as an
autoscaler would add one. Ray reschedules the rollout placement group's bundle onto the new node and restarts both
actors there (`max_restarts`); the pool redoes the lost rollout call with the same rows and seed (rollout/recovery.py).
The run must complete every step, log each step exactly once, and end with the very weights of an uninterrupted run
on the same cluster with the same seed."""

from __future__ import annotations

import json
import threading

import pytest
import ray
from test_chaos import SMALL, _check_same_run, _final_weights, _pids, _report, _when_rollout_is_out

from agentrl_ray.cluster import apply_plan, plan_for_cluster, reserve
from agentrl_ray.config import load_config
from agentrl_ray.driver import resolve_model, train
from agentrl_ray.rollout.pool import RolloutPool
from agentrl_ray.rollout.recovery import RestartableEnvHost
from agentrl_ray.rollout.worker import RolloutWorker
from agentrl_ray.threads import ThreadPolicy

pytestmark = pytest.mark.slow

# The rollout node offers room for two rollout placement groups: the test's pool's and the one the driver reserves
# for a pool of its own (unused here: the test hands `train` its pool to watch and kill it).
ROLLOUT_NODE = {"num_cpus": 4, "resources": {"rollout_node": 10, "env_node": 10}}
NODE_LOSS = [
    *SMALL,
    "rollout.resources={rollout_node: 1}",
    "env.resources={env_node: 1}",
    "learner.resources={learner_node: 1}",
    # A restarted engine answers within seconds here; should Ray never place it, the run stops soon with ActorFailed.
    "recovery.actor_start_s=180",
]


@pytest.fixture(scope="module")
def cluster(builtin_model_path):
    """A head without CPUs (the driver and its metrics log), a learner node, and a rollout node (engine + env host)."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    c.add_node(num_cpus=2, resources={"learner_node": 10})
    c.rollout_node = c.add_node(**ROLLOUT_NODE)
    c.wait_for_nodes()
    ray.init(address=c.address)
    yield c
    ray.shutdown()
    c.shutdown()


def _run(out, name, chaos=None):
    """Train with a pool placed the way the driver places its own (the plan's placement group, pinned to the planned
    node), which the test can reach; `chaos(pool, run_dir)` runs in a thread beside the run."""
    cfg = load_config(None, [*NODE_LOSS, f"run.output_dir={out}", f"run.name={name}"])
    plan = plan_for_cluster(cfg)
    apply_plan(cfg, plan)
    placed = reserve(plan, timeout_s=60)
    try:
        pool = RolloutPool.create(cfg, resolve_model(cfg.model.path), ThreadPolicy.of(cfg), placed)
        try:
            before = _pids(pool)
            thread = threading.Thread(target=chaos, args=(pool, cfg.run_dir), daemon=True) if chaos else None
            if thread:
                thread.start()
            train(cfg, pool=pool)
            if thread:
                thread.join(timeout=60)
            after = _pids(pool)
            nodes = {cls.__name__: _alive_on(cls.__name__) for cls in (RolloutWorker, RestartableEnvHost)}
        finally:
            pool.shutdown()
    finally:
        placed.release()
    records = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return _final_weights(cfg.run_dir), records, before, after, nodes


def _alive_on(class_name: str) -> set[str]:
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")], limit=1000)
    return {a.node_id for a in actors}


def test_a_lost_rollout_node_is_replaced_and_the_run_is_the_same(cluster, tmp_path):
    weights, records, _, _, nodes = _run(tmp_path, "reference")
    reference = (weights, records)
    old = cluster.rollout_node.node_id
    assert nodes == {"RolloutWorker": {old}, "RestartableEnvHost": {old}}  # the node to kill holds both
    replacement = []

    def chaos(pool, run_dir):
        _when_rollout_is_out(pool, run_dir)
        cluster.remove_node(cluster.rollout_node, allow_graceful=False)  # raylet and every worker on it: SIGKILL
        replacement.append(cluster.add_node(**ROLLOUT_NODE))

    weights, records, before, after, nodes = _run(tmp_path, "node_lost", chaos)
    assert replacement, "the node was never killed"
    new = replacement[0].node_id
    assert old not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert nodes == {"RolloutWorker": {new}, "RestartableEnvHost": {new}}  # both restarted on the new node
    assert all(a != b for a, b in zip(after, before))  # new processes
    _report("node lost", records, reference)
    _check_same_run(reference, weights, records, "rollout node lost")
