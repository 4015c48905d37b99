"""The CUDA IPC weight handoff (`sync/ipc.py`) without CUDA: the bucket plan and packing, the handles (their
pickled form and how the receiver opens them), and the receiver's load. The CUDA reduction itself runs in
tests/gpu/test_gpu_e2e.py."""

import asyncio
import pickle

import pytest
import torch

from agentrl_ray.sync.collective import CollectiveBackend
from agentrl_ray.sync.ipc import IpcHandle, ipc_update, local_device_index, open_handle, pack_buckets, received_tensors
from agentrl_ray.sync.receiver import WeightReceiver


def _named():
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(10, 4, generator=g)),
        ("model.norm.weight", torch.randn(4, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(8, 4, generator=g)),
        ("model.layers.0.step", torch.arange(3)),  # not floating point: never cast
    ]


def test_buckets_hold_consecutive_tensors_of_one_dtype_within_the_bound():
    named = _named()
    meta, buckets, buffers = pack_buckets(named, max_bytes=100, dtype=torch.bfloat16)
    assert [m.dtype for m in meta] == ["bfloat16", "bfloat16", "bfloat16", "int64"]
    # 80 bytes + 8 bytes fit in 100; the next 64 bytes do not; the int64 tensor is another dtype.
    assert buckets == [2, 1, 1]
    assert [b.dtype for b in buffers] == [torch.bfloat16, torch.bfloat16, torch.int64]
    assert [b.numel() for b in buffers] == [44, 32, 3]
    assert all(b.is_contiguous() for b in buffers)


def test_a_handle_survives_pickling_and_opens_to_the_tensors_sent():
    """What Ray carries: the update with its handles, pickled. On CPU a handle carries the bytes themselves."""
    named = _named()
    update, buffers = ipc_update(named, 5, max_bytes=100, dtype=torch.bfloat16)
    assert update.transport == "ipc" and update.kind == "full" and len(update.payload) == 3
    assert all(isinstance(h, IpcHandle) and h.device_uuid == "" for h in update.payload)
    received = dict(received_tensors(pickle.loads(pickle.dumps(update))))
    assert list(received) == [n for n, _ in named]
    for name, tensor in named:
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert received[name].dtype == expected.dtype and torch.equal(received[name], expected)


def test_opened_buffer_is_the_senders_memory_in_one_process():
    """In the sender's own process a handle opens onto the same storage, not a copy: the property a CUDA handle
    has across processes."""
    buffer = torch.arange(6, dtype=torch.float32)
    _, buckets, (packed,) = pack_buckets([("w", buffer)], max_bytes=1 << 20)
    from agentrl_ray.sync.ipc import share

    opened = open_handle(share(packed))
    packed[0] = 42.0
    assert opened[0].item() == 42.0


def test_receiver_loads_an_ipc_update_bucket_by_bucket():
    """The receiver streams the buckets into the engine's load; a LoRA update is merged from the model folder."""
    loaded: list[tuple[str, torch.Tensor]] = []
    receiver = WeightReceiver("unused", loaded.extend, CollectiveBackend("gloo", "cpu"))
    update, buffers = ipc_update(_named(), 3, max_bytes=100)
    assert asyncio.run(receiver.receive(update)) == 3
    assert receiver.version == 3
    assert [n for n, _ in loaded] == [n for n, _ in _named()]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(loaded, _named()))


def test_receiver_merges_an_ipc_lora_update(builtin_model_path):
    from agentrl_ray.sync.lora import merge_lora
    from agentrl_ray.sync.packing import load_safetensors_folder

    base = load_safetensors_folder(builtin_model_path)
    name = next(n for n in base if n.endswith("q_proj.weight"))
    out_f, in_f = base[name].shape
    g = torch.Generator().manual_seed(1)
    prefix = name.removesuffix(".weight")
    adapter = {
        prefix + ".lora_A": torch.randn(2, in_f, generator=g),
        prefix + ".lora_B": torch.randn(out_f, 2, generator=g),
    }
    loaded: dict[str, torch.Tensor] = {}
    receiver = WeightReceiver(builtin_model_path, lambda named: loaded.update(named), CollectiveBackend("gloo", "cpu"))
    update, _ = ipc_update(list(adapter.items()), 1, max_bytes=1 << 20, lora_scaling=0.5)
    assert update.kind == "lora"
    asyncio.run(receiver.receive(update))
    assert torch.equal(loaded[name], merge_lora(base, adapter, 0.5)[name])


def test_a_gpu_the_engine_cannot_see_is_named():
    with pytest.raises(RuntimeError, match="GPU GPU-0000 is not visible to this engine; sync.transport=ipc needs"):
        local_device_index("GPU-0000")


def test_the_ipc_sender_takes_the_learners_own_tensors_and_the_others_host_copies(builtin_model_path, monkeypatch):
    """learner/loop.py asks the sender where the weights should be: the IPC sender packs them on the learner's GPU
    itself (the model's own tensors, no trip through host memory); every other sender gets them in host memory. On a
    CPU learner host memory is where they are (`.cpu()` copies nothing): tests/gpu/test_gpu_learner.py checks
    that a GPU learner's host copies are copies."""
    from builders import as_ray_train_rank_zero

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.sync.sender import IpcSender, ObjectStoreSender

    as_ray_train_rank_zero(monkeypatch, torch.device("cpu"))
    cfg = load_config(None, ["profile=cpu", "learner.backend=ddp"])
    policy = Policy(builtin_model_path, cfg.model, cfg.learner, need_reference=False)
    own = {n: t.data_ptr() for n, t in policy.module.state_dict().items()}
    for sender, shared in ((IpcSender(2**20), True), (ObjectStoreSender(), False)):
        named = policy.named_tensors_for_sync(getattr(sender, "device_tensors", False))
        assert [n for n, _ in named] == list(own)
        assert all(t.device.type == "cpu" for _, t in named)
        if shared:
            assert all(t.data_ptr() == own[n] for n, t in named)
