"""Weight packing for the object-store sync: exact round trips, any dtype, read-only buffers, optional cast."""

import torch

from agentrl_ray.sync.packing import pack, unpack


def _named():
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(3, 5, generator=g)),
        ("b.bias", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c.count", torch.arange(3, dtype=torch.int64)),
        ("d.empty", torch.empty(0, 4)),
        ("e.half", torch.randn(1, 1, 3, generator=g).to(torch.float16)),
        ("f.strided", torch.randn(4, 6, generator=g).t()),  # not contiguous
    ]


def test_round_trip_is_exact_from_a_read_only_buffer():
    named = _named()
    meta, buf = pack(named)
    buf.setflags(write=False)  # what a reader of the object store gets
    out = unpack(meta, buf)
    assert [n for n, _ in out] == [n for n, _ in named]
    for (_, want), (_, got) in zip(named, out):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)


def test_cast_touches_floating_point_tensors_only():
    named = _named()
    meta, buf = pack(named, torch.bfloat16)
    out = dict(unpack(meta, buf))
    assert out["a.weight"].dtype == torch.bfloat16
    assert torch.equal(out["a.weight"], named[0][1].to(torch.bfloat16))
    assert out["c.count"].dtype == torch.int64 and torch.equal(out["c.count"], named[2][1])
    assert buf.nbytes < pack(named)[1].nbytes
