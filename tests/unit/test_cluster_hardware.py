"""`profile=auto` and the profiles' CPU requests are sized from the Ray cluster's nodes, not the driver's machine:
`hardware_from_nodes` over `ray.nodes()`-shaped lists (the live-cluster path: tests/ray/test_placement_cluster.py)."""

import pytest

from agentrl_ray.infra.cluster_hardware import hardware_from_nodes, is_this_machine
from agentrl_ray.infra.placement import make_plan, nodes_from_ray
from agentrl_ray.infra.profiles import profile_preset, resolve_profile
from agentrl_ray.infra.sizing import cpus_requested

GIB = 2**30


def node(cpus, gpus=0, mem_gib=16, head=False, alive=True, accel=None, node_id=None):
    res = {"CPU": cpus, "memory": mem_gib * 0.7 * GIB, "object_store_memory": mem_gib * 0.3 * GIB}
    if gpus:
        res["GPU"] = gpus
    if accel:
        res[f"accelerator_type:{accel}"] = 1
    if head:
        res["node:__internal_head__"] = 1
    return {"NodeID": node_id or f"n{cpus}-{gpus}-{head}", "Alive": alive, "Resources": res}


def test_cpu_head_with_gpu_workers_resolves_to_gpu():
    # The driver's own node (the head) has no GPU: sized from the driver, this was the cpu profile.
    nodes = [node(8, head=True), node(96, 8, 1024, accel="H100"), node(96, 8, 1024, accel="H100", node_id="b")]
    hw = hardware_from_nodes(nodes)
    assert (hw.gpus, hw.cpus) == (16, 96)
    assert hw.ram_gib == pytest.approx(1024)
    assert {g.name for g in hw.gpu_devices} == {"H100"}
    assert resolve_profile("auto", hw) == "gpu"


def test_cpu_only_cluster_resolves_to_cpu_and_dead_nodes_do_not_count():
    nodes = [node(4, head=True), node(16, 0, 64), node(32, 8, alive=False)]
    hw = hardware_from_nodes(nodes)
    assert (hw.gpus, hw.cpus) == (0, 16)
    assert resolve_profile("auto", hw) == "cpu"
    # 16 cores, 64 GiB on the largest node: the workstation preset (two engines), sized by that node.
    assert profile_preset("cpu", hw)["rollout"]["num_workers"] == 2


def test_cpu_requests_fit_the_largest_node_not_the_driver():
    # A 2-core laptop driver joined to a cluster of 16-core nodes: requests sized for 16 cores, and the plan places
    # them (each actor's request fits one node).
    from agentrl_ray.config import Config, validate
    from agentrl_ray.config.checking import build as _build

    nodes = [node(2, head=True), node(16, 0, 32), node(16, 0, 32, node_id="b")]
    hw = hardware_from_nodes(nodes)
    preset = profile_preset("cpu", hw)
    assert preset["learner"]["num_cpus_per_worker"] == 4.0  # the 2.0-per-weight cap, not the laptop's 0.6
    cfg = _build(Config, {**preset, "profile": "cpu"})
    validate(cfg)
    assert cpus_requested(cfg) <= hw.cpus
    plan = make_plan(nodes_from_ray(nodes), cfg)
    assert all(s.node_id != nodes[0]["NodeID"] for s in plan.learners)  # the 2-core head cannot hold 4 CPUs


def test_one_gpu_node_sizes_a_one_gpu_run():
    hw = hardware_from_nodes([node(4, 1, 24, head=True, accel="RTX4090")])
    assert (hw.gpus, hw.cpus, hw.gpu_devices[0].name) == (1, 4, "RTX4090")
    assert resolve_profile("auto", hw) == "gpu"


def test_no_alive_node_is_an_error():
    with pytest.raises(ValueError, match="no alive nodes"):
        hardware_from_nodes([node(4, alive=False)])


def test_a_cluster_that_is_this_machine_alone_uses_this_machines_detection():
    # A local ray.init() declares what it is told (e.g. num_cpus=4 on 2 cores); this machine's own detection knows
    # the real cores and the GPUs' memory. Several nodes, or one elsewhere, are the cluster.
    here = {**node(4, head=True), "NodeManagerAddress": "10.0.0.5"}
    other = {**node(8, node_id="b"), "NodeManagerAddress": "10.0.0.6"}
    assert is_this_machine([here], "10.0.0.5")
    assert is_this_machine([here, {**other, "Alive": False}], "10.0.0.5")
    assert not is_this_machine([here, other], "10.0.0.5")
    assert not is_this_machine([other], "10.0.0.5")
