"""The placement plan on a real Ray cluster whose only worker node declares one (logical) GPU: the `gpu` and `lora`
profiles are placed without deadlock (every placement group reserved, every actor and learner rank scheduled on its
planned node with its share of the GPU; no CUDA work runs), and an unsatisfiable plan fails within seconds."""

import time

import pytest
import ray

from agentrl_ray.infra.cluster import apply_plan, learner_scaling, plan_for_cluster, reserve
from agentrl_ray.infra.placement import PlacementError
from agentrl_ray.infra.profiles import load_config


@pytest.fixture(scope="module")
def one_gpu_cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # A head without CPUs (the driver's node) and one worker with 4 CPUs and 1 GPU.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    worker = cluster.add_node(num_cpus=4, num_gpus=1)
    ray.init(address=cluster.address)
    yield worker.node_id
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0)
class Probe:
    def where(self):
        return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()


@pytest.mark.parametrize(
    "profile", [pytest.param("gpu", marks=pytest.mark.long), pytest.param("lora", marks=pytest.mark.long)]
)
def test_one_gpu_places_the_profile(one_gpu_cluster, profile, tmp_path):
    from ray.train.torch import TorchConfig, TorchTrainer

    def learner_where(_config):  # defined here so that it pickles by value (workers cannot import this test)
        return {"node": ray.get_runtime_context().get_node_id(), "gpus": ray.get_gpu_ids()}

    overrides = [f"profile={profile}", "rollout.use_gpu=true", "learner.use_gpu=true"]
    cfg = load_config(None, overrides)
    plan = plan_for_cluster(cfg)
    assert plan.mode == "colocated"
    assert [s.node_id for s in plan.engines + plan.env_hosts + plan.learners] == [one_gpu_cluster] * 3
    assert plan.engines[0].resources["GPU"] + plan.learners[0].resources["GPU"] == 1.0
    apply_plan(cfg, plan)
    # NCCL cannot pair two ranks on one GPU: the gpu profile's collective sync becomes a CUDA IPC handoff; the lora
    # profile's adapter keeps the object store.
    assert cfg.sync.transport == {"gpu": "ipc", "lora": "object_store"}[profile]
    assert cfg.rollout.gpu_memory_utilization == 0.35

    placed = reserve(plan, timeout_s=30)
    try:
        # The plan's engine and env host options, on trivial actors in their bundles.
        actors = [Probe.options(**placed.options(s)).remote() for s in plan.engines + plan.env_hosts]
        where = ray.get([a.where.remote() for a in actors], timeout=60)
        assert [node for node, _ in where] == [one_gpu_cluster] * 2
        assert where[0][1] == [0]  # the engine got the (logical) GPU 0
        # The learner rank through Ray Train with the plan's ScalingConfig, while the engine holds its half.
        trainer = TorchTrainer(
            learner_where,
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=learner_scaling(plan, use_gpu=True),
            run_config=ray.train.RunConfig(storage_path=str(tmp_path), name=profile),
        )
        result = trainer.fit()
        assert result.error is None
        assert result.return_value == {"node": one_gpu_cluster, "gpus": [0]}  # rank 0: the same GPU, shared
        for a in actors:
            ray.kill(a)
    finally:
        placed.release()


@pytest.mark.integration
def test_unsatisfiable_plan_fails_within_seconds(one_gpu_cluster):
    cfg = load_config(
        None, ["profile=gpu", "rollout.num_workers=1", "learner.num_workers=1", "placement.mode=separate"]
    )
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match="GPU: needs 2, cluster has 1"):
        plan_for_cluster(cfg)
    assert time.monotonic() - t0 < 10

    # A plan that fits the nodes but not what is free now (another group holds the GPU): a clear error, no hang.
    from ray.util.placement_group import placement_group, remove_placement_group

    squatter = placement_group([{"GPU": 1}])
    assert squatter.wait(timeout_seconds=30)
    try:
        plan = plan_for_cluster(load_config(None, ["profile=gpu"]))
        t0 = time.monotonic()
        with pytest.raises(PlacementError, match="did not reserve the rollout placement group within"):
            reserve(plan, timeout_s=3)
        assert time.monotonic() - t0 < 20
    finally:
        remove_placement_group(squatter)


@pytest.mark.integration
def test_auto_profile_is_sized_from_the_cluster(one_gpu_cluster):
    # This machine has no GPU and 2 cores; the cluster this process is connected to has 1 GPU and a 4-CPU node.
    cfg = load_config(None, [])
    assert cfg.profile == "gpu"
    assert cfg.learner.num_cpus_per_worker == pytest.approx(2.45)  # 4 CPUs shared out, not the driver's 2
    assert plan_for_cluster(cfg).mode == "colocated"


@pytest.mark.long
def test_multi_node_without_shared_storage_is_refused(one_gpu_cluster, tmp_path):
    """The driver runs in a mount namespace of its own whose tmpfs covers the output folder: the folder it writes
    is one that the worker node (where the learner rank runs) does not see, as on two machines without a shared
    filesystem. `agentrl-ray train` refuses before any actor starts."""
    import os
    import subprocess
    import sys

    private = tmp_path / "driver_only"
    private.mkdir()
    train = [sys.executable, "-m", "agentrl_ray.cli", "train", "profile=cpu", f"run.output_dir={private}/runs"]
    train += ["run.steps=1", "data.eval_size=16"]
    script = f"mount -t tmpfs tmpfs {private} && exec " + " ".join(train)
    # --map-root-user: a private mount namespace without root too (a user namespace, FACTS.md).
    cmd = ["unshare", "--mount", "--map-root-user", "--propagation", "private", "sh", "-c", script]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "do not see" in proc.stderr and "shared filesystem" in proc.stderr, proc.stderr[-3000:]
    assert one_gpu_cluster[:12] in proc.stderr  # names the node
    assert "model folder" not in proc.stderr  # the builtin model's cache is on this machine's shared filesystem
    assert list(private.iterdir()) == []  # everything the driver wrote went to its private tmpfs
    print(f"refused after {time.monotonic() - t0:.1f}s")
