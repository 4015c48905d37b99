"""Weight sync decisions that need no Ray: both ends of the collective group pick the same backend and device for
every profile, buckets stay within their bound, and a malformed update fails where it is made."""

import pytest
import torch

from agentrl_ray.infra.profiles import Hardware, load_config, profile_preset
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
        WeightUpdate(1, "full", meta, buckets=[2], transport="collective")
    with pytest.raises(ValueError, match="payload"):
        WeightUpdate(1, "full", meta)
    with pytest.raises(ValueError, match="transport 'nccl'"):
        WeightUpdate(1, "full", meta, payload=object(), transport="nccl")
    with pytest.raises(ValueError, match="one handle per bucket: 0 for 1"):
        WeightUpdate(1, "full", meta, buckets=[1], transport="ipc")
    assert WeightUpdate(1, "full", meta, buckets=[1], transport="collective").collective
    assert not WeightUpdate(1, "full", meta, payload=object()).collective


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


def _sharded_folder(folder, generator):
    """A bfloat16 model folder in two safetensors shards, embeddings tied (no lm_head.weight saved)."""
    from safetensors.torch import save_file

    def w(*shape):
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)

    save_file(
        {"model.embed_tokens.weight": w(11, 6), "model.layers.0.q_proj.weight": w(6, 6)}, str(folder / "a.safetensors")
    )
    save_file({"model.layers.0.up_proj.weight": w(9, 6), "model.norm.weight": w(6)}, str(folder / "b.safetensors"))


def test_the_engines_streamed_merge_equals_the_merged_export(tmp_path):
    """The engines merge one tensor at a time from the folder (`merged_stream`); a merged export merges the loaded
    folder (`merge_lora(base_weights(...))`). Both must give the same tensors, bit for bit, lm_head last."""
    from agentrl_ray.sync.lora import base_weights, merge_lora, merged_stream

    g = torch.Generator().manual_seed(0)
    _sharded_folder(tmp_path, g)
    adapter = {}
    for prefix, (out, inp) in {"model.layers.0.q_proj": (6, 6), "model.layers.0.up_proj": (9, 6)}.items():
        adapter[prefix + ".lora_A"] = torch.randn(4, inp, generator=g)
        adapter[prefix + ".lora_B"] = torch.randn(out, 4, generator=g)
    exported = merge_lora(base_weights(tmp_path), adapter, 0.5)
    streamed = list(merged_stream(tmp_path, adapter, 0.5))
    assert [name for name, _ in streamed][-1] == "lm_head.weight"
    assert sorted(name for name, _ in streamed) == sorted(exported)
    for name, tensor in streamed:
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, exported[name]), name
    base = base_weights(tmp_path)
    assert not torch.equal(exported["model.layers.0.up_proj.weight"], base["model.layers.0.up_proj.weight"])
    assert torch.equal(exported["model.norm.weight"], base["model.norm.weight"])


def test_an_adapter_that_does_not_fit_the_base_fails_before_the_reload(tmp_path):
    """A half-applied reload would leave an engine with a mix of versions: the check comes before the first tensor."""
    from agentrl_ray.sync.lora import merged_stream

    _sharded_folder(tmp_path, torch.Generator().manual_seed(0))
    a, b = torch.zeros(2, 6), torch.zeros(6, 2)
    with pytest.raises(ValueError, match=r"model.layers.0.k_proj.weight, which the base model does not have"):
        merged_stream(tmp_path, {"model.layers.0.k_proj.lora_A": a, "model.layers.0.k_proj.lora_B": b}, 1.0)
    with pytest.raises(ValueError, match=r"no model.layers.0.q_proj.lora_B"):
        merged_stream(tmp_path, {"model.layers.0.q_proj.lora_A": a}, 1.0)


def _rss_file_bytes() -> int:
    import re
    from pathlib import Path

    return int(re.search(r"RssFile:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def test_a_streamed_folder_keeps_only_the_held_tensors_resident(tmp_path):
    """safetensors tensors are views of a file mapping whose read pages stay resident while it lives. Read through
    one handle, a 128 MB folder would end 128 MB larger; streamed, the file pages resident stay within the tensors
    the reader holds (here one 8 MB tensor at a time, and the generator's own)."""
    from safetensors.torch import save_file

    from agentrl_ray.sync.packing import safetensors_names, stream_safetensors

    mb = 2**20
    save_file({f"t{i:02d}": torch.full((2 * mb,), float(i)) for i in range(16)}, str(tmp_path / "m.safetensors"))
    start, peak = _rss_file_bytes(), 0
    for i, (name, tensor) in enumerate(stream_safetensors(safetensors_names(tmp_path))):
        assert name == f"t{i:02d}" and float(tensor.sum()) == i * 2 * mb  # every page of it read
        del tensor
        peak = max(peak, _rss_file_bytes() - start)
    assert peak < 3 * 8 * mb, f"{peak / mb:.0f} MB of the file resident while streaming 8 MB tensors"
    assert _rss_file_bytes() - start < 8 * mb


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
    update = WeightUpdate(3, "full", meta, buckets=plan_buckets(meta, max_bytes=120), transport="collective")
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
