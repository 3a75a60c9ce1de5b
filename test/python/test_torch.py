"""Torch tensors through the store API (CPU tensors, via data_ptr())."""
import pytest

import kvengine

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")


def test_tensor_round_trip(db):
    t = torch.arange(4096, dtype=torch.float16)
    assert db.put("t", t) == 0
    out = torch.zeros_like(t)
    assert db.get_into("t", out) == t.numel() * t.element_size()
    assert torch.equal(out, t)
    bf = torch.randn(128, dtype=torch.bfloat16)  # no numpy equivalent: data_ptr path
    assert db.put_from("bf", bf) == 0
    out = torch.empty_like(bf)
    assert db.get_into("bf", out.data_ptr(), out.numel() * out.element_size()) == 256
    assert torch.equal(out, bf)


def test_tensor_batches_and_multi_buffers(db):
    kv = torch.randn(2, 8, 16, 4, 32)  # (K/V, blocks, block_size, heads, head_size)
    keys = ["blk%d" % b for b in range(8)]
    parts = [[kv[0, b], kv[1, b]] for b in range(8)]
    assert db.batch_put_from_multi_buffers(keys, parts) == [0] * 8
    out = torch.zeros_like(kv)
    order = [7, 6, 5, 4, 3, 2, 1, 0]  # into different blocks
    got = db.batch_get_into_multi_buffers(keys, [[out[0, order[b]], out[1, order[b]]]
                                                 for b in range(8)])
    assert got == [2 * 16 * 4 * 32 * 4] * 8
    for b in range(8):
        assert torch.equal(out[:, order[b]], kv[:, b])
    ptrs = [[kv[0, b].data_ptr(), kv[1, b].data_ptr()] for b in range(8)]
    nb = kv[0, 0].numel() * kv.element_size()  # torch 1.13 has no .nbytes
    sizes = [[nb, nb] for b in range(8)]
    assert db.batch_put_from_multi_buffers(["p%d" % b for b in range(8)], ptrs, sizes) == [0] * 8
    assert db.get("p3") == kv[:, 3].contiguous().numpy().tobytes()
    flat = [torch.zeros(10, dtype=torch.int64) for _ in range(3)]
    assert db.batch_put_from(["a", "b", "c"], [torch.full((10,), i) for i in range(3)]) == [0] * 3
    assert db.batch_get_into(["a", "b", "c"], flat) == [80] * 3
    assert [int(f[0]) for f in flat] == [0, 1, 2]


def test_bad_tensors_raise(db):
    kv = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match="contiguous"):
        db.put("k", kv.transpose(1, 2))
    with pytest.raises(ValueError, match="contiguous"):
        db.batch_get_into_multi_buffers(["k"], [[kv[:, 0]]])
    meta = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match="device 'meta'"):
        db.put("k", meta)
    assert db.is_exist("k") == 0
    assert db.stats()["puts"] == 0


class _CudaLabelled:
    """A CPU tensor that reports device 'cuda': how the module treats a CUDA tensor's
    data_ptr() without a GPU.  The engine classifies every pointer itself (docs/gpu.md), so
    host memory behind the label takes the ordinary path."""

    class _Device:
        type = "cuda"

    def __init__(self, t):
        self.t = t
        self.device = self._Device()

    def data_ptr(self):
        return self.t.data_ptr()

    def element_size(self):
        return self.t.element_size()

    def numel(self):
        return self.t.numel()

    def is_contiguous(self):
        return self.t.is_contiguous()


def test_cuda_tensors_go_to_the_engine_in_a_cuda_build(db):
    src = torch.arange(1024, dtype=torch.int32)
    out = torch.zeros_like(src)
    if kvengine.CUDA_BUILD:
        assert db.put("cuda", _CudaLabelled(src)) == 0
        assert db.batch_get_into(["cuda"], [_CudaLabelled(out)]) == [4096]
        assert torch.equal(out, src)
    else:
        with pytest.raises(ValueError, match="built without CUDA"):
            db.put("cuda", _CudaLabelled(src))
        assert db.is_exist("cuda") == 0
