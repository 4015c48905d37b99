"""The placement plan over declared clusters: 1x1, 1x8, 4x8 GPUs, mixed CPU/GPU nodes, CPU-only nodes, a head with
no CPUs; unsatisfiable plans fail at once with what is missing."""

import pytest

from agentrl_ray.infra.placement import Node, PlacementError, make_plan, nodes_from_ray, nodes_from_spec
from agentrl_ray.infra.profiles import load_config


def _cfg(*overrides):
    return load_config(None, list(overrides))


def _gpu_lora():
    # The lora profile picks GPUs from this machine's hardware; say it explicitly for a GPU cluster.
    return _cfg("profile=lora", "rollout.use_gpu=true", "learner.use_gpu=true")


def _used(plan, node_id, key):
    return sum(s.resources.get(key, 0) for s in plan.engines + plan.env_hosts + plan.learners if s.node_id == node_id)


def _within_capacity(plan):
    for n in plan.nodes:
        for key, have in n.capacity().items():
            assert _used(plan, n.node_id, key) <= have + 1e-9, (n, key)


@pytest.mark.parametrize("profile", ["gpu", "lora"])
def test_one_gpu_colocates_engine_and_learner(profile):
    cfg = _cfg("profile=gpu") if profile == "gpu" else _gpu_lora()
    plan = make_plan(nodes_from_spec('[{"CPU": 8, "GPU": 1}]'), cfg)
    assert plan.mode == "colocated"
    assert len(plan.engines) == 1 and len(plan.learners) == 1
    assert plan.engines[0].resources["GPU"] + plan.learners[0].resources["GPU"] == 1.0  # not the old 1.4
    assert plan.gpu_memory_utilization == 0.35
    _within_capacity(plan)


def test_one_node_eight_gpus_separate():
    plan = make_plan(nodes_from_spec('[{"CPU": 96, "GPU": 8}]'), _cfg("profile=gpu"))
    assert plan.mode == "separate"
    assert len(plan.engines) == 4 and len(plan.learners) == 4 and len(plan.env_hosts) == 4
    assert all(s.resources["GPU"] == 1 for s in plan.engines + plan.learners)
    assert plan.gpu_memory_utilization == 0.85
    # Every env host sits in its engine's bundle: one bundle per engine.
    assert len(plan.bundles) == 4 and {h.bundle for h in plan.env_hosts} == {0, 1, 2, 3}
    _within_capacity(plan)


def test_four_nodes_of_eight_gpus_with_tensor_parallel_and_a_cpu_head():
    nodes = nodes_from_spec('[{"CPU": 8, "head": true}, {"count": 4, "CPU": 96, "GPU": 8}]')
    plan = make_plan(nodes, _cfg("profile=gpu", "rollout.tensor_parallel_size=2"))
    assert len(plan.learners) == 16 and len(plan.engines) == 8
    assert all(s.resources["GPU"] == 2 for s in plan.engines)
    head = nodes[0].node_id
    assert all(s.node_id != head for s in plan.engines + plan.learners)
    # Engines fill whole nodes first, learner ranks the rest: rollout and learning never share a node's GPUs.
    engine_nodes = {s.node_id for s in plan.engines}
    learner_nodes = {s.node_id for s in plan.learners}
    assert len(engine_nodes) == 2 and not engine_nodes & learner_nodes
    _within_capacity(plan)
    assert "node 0 (node0, head)" in plan.describe() and "idle" in plan.describe()


def test_mixed_cpu_and_gpu_nodes_put_env_hosts_where_cpus_are():
    nodes = nodes_from_spec('[{"CPU": 4, "GPU": 2}, {"CPU": 32, "resources": {"envs": 1}}]')
    plan = make_plan(
        nodes, _cfg("profile=gpu", "env.num_actors=4", "env.num_cpus_per_actor=4", "env.resources={envs: 0.1}")
    )
    assert {s.node_id for s in plan.env_hosts} == {"node1"}
    assert {s.node_id for s in plan.engines + plan.learners} == {"node0"}
    assert len(plan.bundles) == 1 + 4  # the engine's bundle, then one per env host on the other node
    _within_capacity(plan)


def test_engines_on_cpu_leave_every_gpu_to_the_learner():
    plan = make_plan(nodes_from_spec('[{"CPU": 32, "GPU": 4}]'), _cfg("profile=gpu", "rollout.use_gpu=false"))
    assert plan.mode == "separate" and len(plan.learners) == 4 and len(plan.engines) == 1
    assert "GPU" not in plan.engines[0].resources


def test_cpu_only_cluster_with_a_head_that_has_no_cpus():
    nodes = nodes_from_spec('[{"CPU": 0, "head": true}, {"CPU": 4, "resources": {"a": 1}}, {"CPU": 4}]')
    plan = make_plan(nodes, _cfg("profile=cpu", "learner.resources={a: 1}"))
    assert plan.mode == "cpu"
    assert plan.learners[0].node_id == "node1"
    assert all(s.node_id != "node0" for s in plan.engines + plan.env_hosts)
    assert all("GPU" not in s.resources for s in plan.engines + plan.learners)


def test_custom_resources_split_roles_over_three_nodes():
    nodes = nodes_from_spec(
        '[{"CPU": 0, "head": true}, {"CPU": 2, "resources": {"rollout_node": 10}},'
        ' {"CPU": 2, "resources": {"env_node": 10}}, {"CPU": 2, "resources": {"learner_node": 10}}]'
    )
    cfg = _cfg(
        "profile=cpu",
        "rollout.resources={rollout_node: 1}",
        "env.resources={env_node: 1}",
        "learner.resources={learner_node: 1}",
    )
    plan = make_plan(nodes, cfg)
    assert [s.node_id for s in plan.engines + plan.env_hosts + plan.learners] == ["node1", "node2", "node3"]


def test_a_slot_is_pinned_by_excluding_the_plans_other_nodes():
    """While the cluster is as planned only the planned node qualifies; a node that joins later (the replacement of
    a lost one) does too, so Ray can reschedule a dead node's bundles there (tests/ray/test_node_loss.py)."""
    from ray._private.label_utils import validate_label_selector

    from agentrl_ray.infra.cluster import NODE_LABEL, pin

    nodes = nodes_from_spec('[{"CPU": 0, "head": true}, {"count": 3, "CPU": 2}]')
    plan = make_plan(nodes, _cfg("profile=cpu"))
    selector = pin(plan.engines[0].node_id, plan)
    others = sorted({"node0", "node1", "node2", "node3"} - {plan.engines[0].node_id})
    assert selector == {NODE_LABEL: f"!in({','.join(others)})"}
    assert validate_label_selector(selector) is None  # Ray's own check of the syntax
    alone = make_plan(nodes_from_spec('[{"CPU": 4}]'), _cfg("profile=cpu"))
    assert pin(alone.engines[0].node_id, alone) == {}  # one node: nothing to exclude


@pytest.mark.parametrize(
    "spec, overrides, message",
    [
        ('[{"CPU": 8}]', ["profile=gpu"], "no node of the Ray cluster has any"),
        ('[{"CPU": 8, "GPU": 1}]', ["profile=gpu", "placement.mode=separate"], "no GPUs left for an engine"),
        (
            '[{"CPU": 8, "GPU": 1}]',
            ["profile=gpu", "rollout.num_workers=1", "learner.num_workers=1", "placement.mode=separate"],
            "GPU: needs 2, cluster has 1",
        ),
        # Explicit requests: the profile's own are sized to fit the machine running the test (sizing.py).
        (
            '[{"CPU": 1}]',
            [
                "profile=cpu",
                "rollout.num_cpus_per_worker=0.5",
                "learner.num_cpus_per_worker=1",
                "env.num_cpus_per_actor=0.25",
            ],
            "CPU: needs 1.75, cluster has 1",
        ),
        (
            '[{"CPU": 4, "GPU": 2}, {"CPU": 4, "GPU": 2}]',
            ["profile=gpu", "rollout.tensor_parallel_size=3", "learner.num_workers=1", "rollout.num_workers=1"],
            "tensor_parallel_size GPUs must be on one node",
        ),
        ('[{"CPU": 8}]', ["profile=cpu", "env.resources={sandbox: 1}"], "sandbox: needs 1, cluster has 0"),
        (
            '[{"CPU": 8, "GPU": 2}]',
            ["profile=gpu", "placement.mode=colocated", "rollout.tensor_parallel_size=2"],
            "tensor_parallel_size=1",
        ),
    ],
)
def test_unsatisfiable_plans_say_what_is_missing(spec, overrides, message):
    with pytest.raises(PlacementError, match=message.replace("(", r"\(")):
        make_plan(nodes_from_spec(spec), _cfg(*overrides))


def test_nodes_from_ray_reads_custom_resources_and_the_head():
    ray_nodes = [
        {
            "Alive": True,
            "NodeID": "w",
            "Resources": {
                "CPU": 4.0,
                "GPU": 2.0,
                "memory": 1e9,
                "node:10.0.0.2": 1.0,
                "accelerator_type:A10G": 1.0,
                "env_node": 5.0,
            },
        },
        {"Alive": False, "NodeID": "dead", "Resources": {"CPU": 64.0}},
        {"Alive": True, "NodeID": "h", "Resources": {"node:__internal_head__": 1.0, "node:10.0.0.1": 1.0}},
    ]
    nodes = nodes_from_ray(ray_nodes)
    assert nodes == [Node("h", 0.0, 0.0, {}, head=True), Node("w", 4.0, 2.0, {"env_node": 5.0})]


def test_bad_node_spec_is_a_clear_error():
    with pytest.raises(Exception, match="not JSON"):
        nodes_from_spec("4x8")
    with pytest.raises(Exception, match="unknown keys"):
        nodes_from_spec('[{"gpus": 8}]')


def test_sync_transport_follows_the_plan():
    """Colocated on one GPU: the gpu profile's NCCL sync becomes a CUDA IPC handoff (NCCL refuses two ranks on one
    GPU); colocated on more GPUs, the object store; ipc asked for where engines sit on other GPUs fails at once."""
    from agentrl_ray.infra.cluster import apply_plan

    cfg = _cfg("profile=gpu")
    apply_plan(cfg, make_plan(nodes_from_spec('[{"CPU": 8, "GPU": 1}]'), cfg))
    assert cfg.sync.transport == "ipc"
    cfg = _cfg("profile=gpu", "placement.mode=colocated")
    apply_plan(cfg, make_plan(nodes_from_spec('[{"CPU": 16, "GPU": 2}]'), cfg))
    assert cfg.sync.transport == "object_store"
    cfg = _cfg("profile=gpu", "placement.mode=colocated", "sync.transport=ipc")
    with pytest.raises(PlacementError, match="every engine must share it: this plan \\(colocated\\) has 2 engine"):
        apply_plan(cfg, make_plan(nodes_from_spec('[{"CPU": 16, "GPU": 2}]'), cfg))


def test_the_stream_pipeline_needs_engines_apart_and_the_plan_says_which_pipeline_runs():
    stream = ("profile=gpu", "sync.transport=object_store", "sync.pipeline=stream", "sync.max_staleness=2")
    with pytest.raises(PlacementError, match="on one GPU they would share it"):
        make_plan(nodes_from_spec('[{"CPU": 8, "GPU": 1}]'), _cfg(*stream))
    plan = make_plan(nodes_from_spec('[{"count": 2, "CPU": 16, "GPU": 4}]'), _cfg(*stream))
    assert plan.mode == "separate" and "pipeline: stream, k=2" in plan.describe()
    assert "on their own GPUs" in plan.pipeline
    assert (
        "share the nodes' cores"
        in make_plan(nodes_from_spec('[{"CPU": 2}]'), _cfg("profile=cpu", *stream[2:])).pipeline
    )
    apart = '[{"CPU": 2, "resources": {"rollout_node": 4}}, {"CPU": 2, "resources": {"learner_node": 4}}]'
    pinned = (
        "rollout.resources={rollout_node: 1}",
        "env.resources={rollout_node: 1}",
        "learner.resources={learner_node: 1}",
    )
    plan = make_plan(nodes_from_spec(apart), _cfg("profile=cpu", *stream[2:], *pinned))
    assert "on separate nodes" in plan.pipeline and {s.node_id for s in plan.engines} == {"node0"}
    assert make_plan(nodes_from_spec('[{"CPU": 2}]'), _cfg("profile=cpu")).pipeline.startswith("batch, k=")
