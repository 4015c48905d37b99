"""Weight sync decisions that need no Ray: both ends of the collective group pick the same backend and device for
every profile, buckets stay within their bound, and a malformed update fails where it is made."""

import pytest
import torch

from agentrl_ray.config import load_config
from agentrl_ray.profiles import Hardware, profile_preset
from agentrl_ray.sync.collective import CollectiveBackend, collective_backend, plan_buckets
from agentrl_ray.sync.receiver import WeightReceiver
from agentrl_ray.sync.sender import CollectiveSender, ObjectStoreSender, make_sender
from agentrl_ray.types import TensorMeta, WeightUpdate


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["profile=cpu", "sync.transport=collective"], CollectiveBackend("gloo", "cpu")),
        (["profile=lora"], CollectiveBackend("gloo", "cpu")),
        (["profile=gpu"], CollectiveBackend("nccl", "cuda")),
        # Learner on GPU, engines on CPU: one end cannot run NCCL, so both take gloo on CPU.
        (["profile=gpu", "rollout.use_gpu=false"], CollectiveBackend("gloo", "cpu")),
    ],
)
def test_sender_and_receiver_pick_the_same_backend(overrides, expected):
    cfg = load_config(None, overrides)
    receiver_side = collective_backend(cfg)  # what RolloutPool.create hands every worker's WeightReceiver
    sender = make_sender(cfg, lora_scaling=None)
    if cfg.sync.transport == "collective":
        assert isinstance(sender, CollectiveSender) and sender.backend == receiver_side == expected
    else:
        assert isinstance(sender, ObjectStoreSender) and receiver_side == expected


def test_gpu_preset_is_the_profile_that_broadcasts_over_nccl():
    preset = profile_preset("gpu", Hardware(cpus=16, ram_gib=64, gpus=2))
    assert preset["sync"]["transport"] == "collective" and preset["learner"]["use_gpu"]
    assert preset["rollout"]["use_gpu"]


def test_receiver_refuses_a_group_on_another_backend():
    receiver = WeightReceiver("unused", load=lambda named: None, backend=CollectiveBackend("gloo", "cpu"))
    with pytest.raises(RuntimeError, match="nccl"):
        receiver.join_group("127.0.0.1", 1, 2, 1, CollectiveBackend("nccl", "cuda"))


def _meta(name, dtype, *shape):
    return TensorMeta(name, dtype, tuple(shape))


def test_buckets_are_bounded_and_of_one_dtype():
    tensors = [
        _meta("a", "float32", 10),  # 40 bytes
        _meta("b", "float32", 10),
        _meta("c", "float32", 20),  # 80 bytes: would overflow the first bucket
        _meta("d", "bfloat16", 4),  # another dtype: a new bucket
        _meta("e", "float32", 100),  # larger than a bucket: alone
        _meta("f", "float32", 1),
    ]
    assert plan_buckets(tensors, max_bytes=100) == [2, 1, 1, 1, 1]
    assert plan_buckets(tensors, max_bytes=10**6) == [3, 1, 2]
    sizes = {"float32": 4, "bfloat16": 2}
    start = 0
    for count in plan_buckets(tensors, max_bytes=100):
        chunk = tensors[start : start + count]
        start += count
        assert len({t.dtype for t in chunk}) == 1
        assert count == 1 or sum(t.numel * sizes[t.dtype] for t in chunk) <= 100


def test_weight_update_validates():
    meta = [_meta("a", "float32", 2)]
    with pytest.raises(ValueError, match="kind"):
        WeightUpdate(1, "state_dict", meta, payload=object())
    with pytest.raises(ValueError, match="lora_scaling"):
        WeightUpdate(1, "lora", meta, payload=object())
    with pytest.raises(ValueError, match="buckets hold 2"):
        WeightUpdate(1, "full", meta, buckets=[2])
    with pytest.raises(ValueError, match="payload"):
        WeightUpdate(1, "full", meta)
    assert WeightUpdate(1, "full", meta, buckets=[1]).collective


def test_object_store_receiver_merges_lora_into_its_base(tmp_path):
    """The LoRA merge, W = W0 + scaling * B @ A, on the engine side; only the adapter travels."""
    import asyncio

    from safetensors.torch import save_file

    from agentrl_ray.sync.packing import pack

    w0 = torch.randn(3, 4)
    save_file({"layer.weight": w0, "model.embed_tokens.weight": torch.ones(2, 2)}, str(tmp_path / "m.safetensors"))
    a, b = torch.randn(2, 4), torch.randn(3, 2)
    loaded = {}
    receiver = WeightReceiver(
        str(tmp_path),
        load=lambda named: loaded.update(named),
        backend=collective_backend(load_config(None, ["profile=cpu"])),
    )
    meta, buf = pack([("layer.lora_A", a), ("layer.lora_B", b)])

    async def ref():
        return buf

    async def receive():
        return await receiver.receive(WeightUpdate(7, "lora", meta, payload=ref(), lora_scaling=0.5))

    assert asyncio.run(receive()) == 7 and receiver.version == 7
    assert torch.allclose(loaded["layer.weight"], w0 + 0.5 * b @ a)
    assert torch.equal(loaded["lm_head.weight"], torch.ones(2, 2))  # tied embeddings: the reload expects both


def test_collective_streams_bucket_by_bucket():
    """Rank 0 and a receiver in two threads of this process over a real gloo group: the receiver gets every tensor
    exactly and in order, over one broadcast per bucket of bounded size and one dtype."""
    import threading

    from agentrl_ray.sync.collective import CollectiveGroup, free_port

    g = torch.Generator().manual_seed(0)
    named = [
        ("a", torch.randn(4, 5, generator=g)),
        ("b", torch.randn(7, generator=g)),
        ("c", torch.randn(3, 3, generator=g).to(torch.bfloat16)),
        ("d", torch.randn(40, generator=g)),
    ]
    meta = [TensorMeta(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in named]
    update = WeightUpdate(3, "full", meta, buckets=plan_buckets(meta, max_bytes=120))
    assert update.buckets == [2, 1, 1]  # a + b = 108 bytes; c another dtype; d 160 bytes alone
    backend, port = CollectiveBackend("gloo", "cpu"), free_port()
    received, broadcasts_seen = {}, []

    def receiver():
        group = CollectiveGroup("127.0.0.1", port, 2, 1, backend)
        stream = group.receive(update)
        for name, tensor in stream:
            received[name] = tensor.clone()
            broadcasts_seen.append(name)

    thread = threading.Thread(target=receiver)
    thread.start()
    CollectiveGroup("127.0.0.1", port, 2, 0, backend).send(named, update)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert broadcasts_seen == ["a", "b", "c", "d"]
    for name, tensor in named:
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor)
