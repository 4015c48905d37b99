"""Several Ray nodes on this machine (separate raylets and object stores): a head without CPUs, engines on one
node, env hosts on another, the learner on a third (custom resources), as on a real cluster. The default task trains
4 steps with a weight sync after every step across nodes, every output under one storage path, then resumes with
the collective transport; and after a sync from another node through either transport the engine's greedy tokens
equal the sender's model."""

import json

import pytest
import ray
import torch

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.recovery import RestartableEnvHost
from agentrl_ray.rollout.worker import RolloutWorker

# The actor classes Ray reports for each role (env hosts run as the restartable subclass: rollout/recovery.py).
ROLES = {
    "rollout_node": RolloutWorker.__name__,
    "env_node": RestartableEnvHost.__name__,
    "learner_node": "RayTrainWorker",
}
SMALL = [
    "profile=cpu",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.resources={rollout_node: 1}",
    "env.resources={env_node: 1}",
    "learner.resources={learner_node: 1}",
    "data.train_size=32",
    "data.eval_size=4",
    "run.eval_samples=1",
    "run.eval_every=0",
    "run.eval_at_start=false",
    "run.checkpoint_every=2",
    "sync.max_staleness=0",
    "learner.lr=1e-3",
    "run.name=multi",
]


@pytest.fixture(scope="module")
def cluster(builtin_model_path):
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = {role: c.add_node(num_cpus=2, resources={role: 10}).node_id for role in ROLES}
    c.wait_for_nodes()
    ray.init(address=c.address)
    yield nodes
    ray.shutdown()
    c.shutdown()


def _actor_nodes(class_name: str) -> set[str]:
    from ray.util.state import list_actors

    return {a.node_id for a in list_actors(filters=[("class_name", "=", class_name)], limit=1000)}


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long
def test_three_nodes_train_sync_every_step_and_resume(cluster, tmp_path):
    storage = tmp_path / "storage"
    cfg = load_config(None, [*SMALL, "run.steps=4", f"run.output_dir={storage}"])
    metrics = train(cfg)
    run_dir = storage / "multi"
    assert metrics["samples"] == 4 * 2 * 2

    plan = json.loads((run_dir / "placement.json").read_text())
    assert {s["node"] for s in plan["engines"]} == {cluster["rollout_node"]}
    assert {s["node"] for s in plan["env_hosts"]} == {cluster["env_node"]}
    assert {s["node"] for s in plan["learners"]} == {cluster["learner_node"]}
    for role, class_name in ROLES.items():  # where Ray actually ran them
        assert _actor_nodes(class_name) == {cluster[role]}, class_name

    records = _records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 5))
    # Every step pushed weights that every engine loaded before sampling the next step (on-policy).
    assert all(r["time/sync_s"] > 0 for r in records)
    assert all(r["time/load_weights_s"] > 0 for r in records[1:])
    assert all(r.get("rollout/staleness", 0) == 0 for r in records)
    for name in ("checkpoint_000002", "checkpoint_000004", "summary.json", "reward_curve.png", "config.json"):
        assert (run_dir / name).exists(), name

    # Resume from the step-4 checkpoint with the collective (gloo) transport: 2 more steps, counting on.
    overrides = [*SMALL, "run.steps=6", f"run.output_dir={storage}", "run.resume=true", "sync.transport=collective"]
    metrics = train(load_config(None, overrides))
    assert metrics["samples"] == 6 * 2 * 2
    assert [r["step"] for r in _records(run_dir)] == list(range(1, 7))
    assert (run_dir / "checkpoint_000006" / "trainer_state.pt").exists()


@pytest.mark.parametrize(
    "transport",
    [pytest.param("object_store", marks=pytest.mark.long), pytest.param("collective", marks=pytest.mark.integration)],
)
def test_sync_across_nodes_makes_the_engine_equal_to_the_sender(cluster, builtin_model_path, transport):
    """The test process (on the head node) plays learner rank 0; the engine runs on the rollout node."""
    from transformers import AutoModelForCausalLM

    from agentrl_ray.infra.cluster import apply_plan, plan_for_cluster, reserve
    from agentrl_ray.rollout.pool import RolloutPool
    from agentrl_ray.sync.collective import collective_backend
    from agentrl_ray.sync.sender import CollectiveSender, ObjectStoreSender

    cfg = load_config(None, SMALL)
    plan = plan_for_cluster(cfg)
    apply_plan(cfg, plan)
    placed = reserve(plan, timeout_s=60)
    pool = RolloutPool.create(cfg, builtin_model_path, placed=placed)
    try:
        model = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)
        torch.manual_seed(0)
        with torch.no_grad():  # move every weight: greedy output must change
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        prompt = [[1, 2, 3, 4, 5, 6]]
        expected = model.generate(
            torch.tensor(prompt), max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None
        )[0, 6:].tolist()
        before = pool.greedy(prompt, 12)[0][0][0]
        sync = ObjectStoreSender() if transport == "object_store" else CollectiveSender(collective_backend(cfg), 2**16)
        sync.setup(pool.workers)
        sync.push([(n, t.detach().clone()) for n, t in model.state_dict().items()], 7)
        sync.flush()  # the object-store update would otherwise travel with the next rollout
        assert pool.versions() == [7]
        after = pool.greedy(prompt, 12)[0][0][0]
        assert before != expected, "the perturbation did not change greedy output: weak test"
        assert after == expected
    finally:
        pool.shutdown()
        placed.release()


@pytest.mark.integration
def test_hub_model_is_one_snapshot_on_every_node(cluster, builtin_model_path, tmp_path, monkeypatch):
    """A Hub id resolved offline on the driver; the nodes that run engines and learner ranks find the same commit's
    snapshot at the same path."""
    import shutil

    from agentrl_ray.builtin.resolve import resolve_model
    from agentrl_ray.infra.cluster import ensure_model_on_nodes, plan_for_cluster

    commit = "fedcba9876543210fedcba9876543210fedcba98"
    repo = tmp_path / "hub" / "models--agentrl--tiny-calculator"
    shutil.copytree(builtin_model_path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(None, [*SMALL, "model.path=agentrl/tiny-calculator"])
    snapshot = resolve_model(cfg.model.path)
    assert snapshot == str(repo / "snapshots" / commit)
    plan = plan_for_cluster(cfg)
    ensure_model_on_nodes("agentrl/tiny-calculator", snapshot, plan)  # raises if a node resolves elsewhere
    with pytest.raises(Exception, match="not in"):
        ensure_model_on_nodes("agentrl/not-cached", str(tmp_path / "x" / commit), plan)
