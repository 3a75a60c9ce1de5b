"""The project's stand-in of the SGLang main objects a HiCache storage backend meets.

SGLang itself is not installed here; these classes follow SGLang main member for member
(names, parameters, defaults; test/python/sglang_conformance.py checks that against a
SGLang source tree, the commit is recorded in docs/sglang.md), with the behaviour the
storage path depends on:

* StorageBackendFactory (python/sglang/srt/mem_cache/storage/backend_factory.py): the
  registry and the "dynamic" backend, built as cls(storage_config, kwargs).
* The device pools' descriptors (memory_pool.py: KVCache, MHATokenToKVPool,
  MLATokenToKVPool): the geometry the host pools read; no device buffers.
* The host pools (mem_cache/pool_host/{base,mha,mla}.py): HostKVCache,
  MHATokenToKVPoolHost and MLATokenToKVPoolHost with SGLang's buffer shapes for the
  layer_first, page_first, page_first_direct (and MHA page_head) layouts, its
  allocator, flat data pages and get_page_buffer_meta (the pointers and sizes the
  zero-copy path moves).  Their device transfers (load_to_device_per_layer,
  backup_from_device_all_layer) need SGLang's CUDA kernels and are left out.
* Hybrid models (memory_pool_host.py, hybrid_cache/hybrid_cache_controller.py):
  DSATokenToKVPool's descriptor, MambaPoolHost and DSAIndexerPoolHost with SGLang's page
  parts (get_page_buffer_meta), PoolEntry and HostPoolGroup, and HybridCacheController's
  v2 storage steps with its StorageOperation / PrefetchOperation (here
  HybridStorageOperation / HybridPrefetchOperation).  MambaPoolDescriptor is not
  SGLang's: it holds what MambaPoolHost reads of SGLang's MambaPool.
* HiCacheController (managers/cache_controller.py): attaching a backend, the storage
  config it builds, the choice of the zero-copy or copy page functions, the MLA backup
  skip, and the bodies of its prefetch (hit query, page transfer) and backup steps.
  Its threads are not started: a test calls those steps itself, in the order the
  threads would, and does the min all-reduce over ranks the prefetch thread does.
"""

import dataclasses
import hashlib
import importlib
import threading
import time
from typing import Any, Dict, List, Optional

import torch

from kvengine.sglang._sglang_compat import HiCacheStorage, HiCacheStorageConfig, \
    HiCacheStorageExtraInfo, PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult

STORAGE_BATCH_SIZE = 128  # hicache_storage.py: max pages per batched storage call

# torch before 2.1 has no float8 dtypes; SGLang keeps fp8 caches as uint8 either way
# (KVCache.store_dtype), so a name stands for the dtype where torch lacks it.
FP8_E4M3 = getattr(torch, "float8_e4m3fn", "float8_e4m3fn")
FP8_E5M2 = getattr(torch, "float8_e5m2", "float8_e5m2")
_FP8 = (FP8_E4M3, FP8_E5M2)


def _allocate(pool, dims):
    """The host buffer (SGLang: ALLOC_MEMORY_FUNCS, pinned with cudaHostRegister)."""
    return torch.empty(dims, dtype=pool.dtype, device=pool.device, pin_memory=pool.pin_memory)


def _page_view(pool, index):
    """The page of a host pool that starts at host slot index (a view): MHA buffers
    lead with the K/V dimension, MLA buffers do not."""
    kv = (slice(None),) if isinstance(pool, MHATokenToKVPoolHost) else ()
    if pool.layout == "layer_first":
        return pool.kv_buffer[kv + (slice(None), slice(index, index + pool.page_size))]
    if pool.layout == "page_first":
        return pool.kv_buffer[kv + (slice(index, index + pool.page_size),)]
    if pool.layout in ("page_first_direct", "page_head"):
        page = index // pool.page_size
        return pool.kv_buffer[kv + (slice(page, page + 1),)]
    raise ValueError(f"Unsupported layout: {pool.layout}")


def _data_page(pool, index, flat):
    page = _page_view(pool, index)
    return page.flatten() if flat else page


def _set_page(pool, index, data_page):
    view = _page_view(pool, index)
    view.copy_(data_page.reshape(view.shape))


def _size_pool(pool, device_pool, host_to_device_ratio, host_size):
    """A host pool's size in slots: host_size GB, else the device pool's times the ratio,
    in whole pages and one more (SGLang rounds the same way)."""
    if host_size > 0:
        pool.size = int(host_size * 1e9 // pool.size_per_token)
    else:
        pool.size = int(device_pool.size * host_to_device_ratio)
    pool.page_num = pool.size // pool.page_size + 1
    pool.size = pool.page_num * pool.page_size


def _itemsize(dtype):
    """dtype.itemsize (torch >= 2.1, which SGLang requires; Debian's torch is older)."""
    return torch.empty((), dtype=dtype).element_size()


# ------------------------------------------------------------ sglang.srt.runtime_context

class _Parallel:
    def __init__(self):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = 0, 1, 0, 1


_parallel = _Parallel()


@dataclasses.dataclass
class ServerArgs:
    """sglang/srt/server_args.py: the fields the backend's fingerprint reads."""

    model_path: str
    revision: Optional[str] = None
    json_model_override_args: str = "{}"
    dtype: str = "auto"
    quantization: Optional[str] = None
    kv_cache_dtype: str = "auto"


_server_args = None  # what the scheduler publishes (set_server_args below)


def get_global_server_args():
    """This process's ServerArgs (SGLang: published by the scheduler at start)."""
    return _server_args


def set_server_args(args):
    global _server_args
    _server_args = args


def get_parallel():
    """This process's ranks (SGLang: sglang.srt.runtime_context.get_parallel())."""
    return _parallel


def set_parallel(tp_rank, tp_size, pp_rank=0, pp_size=1):
    """What SGLang's process-group setup does for get_parallel(), for a test process."""
    _parallel.tp_rank, _parallel.tp_size = tp_rank, tp_size
    _parallel.pp_rank, _parallel.pp_size = pp_rank, pp_size


# ------------------------------------------------------------ sglang.srt.mem_cache.utils

def get_hash_str(token_ids: List[int], prior_hash: Optional[str] = None,
                 page_size: Optional[int] = None):
    """Chained SHA-256 page hashes as hex strings (SGLang computes them natively; the
    backend treats them as opaque)."""
    def one(tokens, prior):
        h = hashlib.sha256(bytes.fromhex(prior) if prior else b"")
        h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
        return h.hexdigest()
    if page_size is None:
        return one(token_ids, prior_hash)
    out = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        prior_hash = one(token_ids[start:start + page_size], prior_hash)
        out.append(prior_hash)
    return out


# ------------------------------------------------------------ device pools (descriptors)

class KVCache:
    layer_shard_enabled: bool = False
    post_capture_active: bool = False

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, layer_num: int,
                 device: str, enable_memory_saver: bool, start_layer: Optional[int] = None,
                 end_layer: Optional[int] = None, allocation_label: Optional[str] = None):
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.store_dtype = torch.uint8 if dtype in _FP8 else dtype
        self.layer_num = layer_num
        self.start_layer = start_layer or 0
        self.end_layer = end_layer or layer_num - 1
        self.allocation_label = allocation_label


class MHATokenToKVPool(KVCache):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int,
                 head_dim: int, layer_num: int, device: str, enable_memory_saver: bool,
                 v_head_dim: Optional[int] = None, swa_head_num: Optional[int] = None,
                 swa_head_dim: Optional[int] = None, swa_v_head_dim: Optional[int] = None,
                 start_layer: Optional[int] = None, end_layer: Optional[int] = None,
                 enable_alt_stream: bool = True, enable_kv_cache_copy: bool = False,
                 kv_cache_layout: Optional[str] = None, quant_method=None,
                 post_capture_active: bool = False, allocation_label: Optional[str] = None):
        super().__init__(size, page_size, dtype, layer_num, device, enable_memory_saver,
                         start_layer, end_layer, allocation_label)
        self.head_num = swa_head_num if swa_head_num is not None else head_num
        self.head_dim = swa_head_dim if swa_head_dim is not None else head_dim
        self.v_head_dim = swa_v_head_dim or v_head_dim or head_dim


class MLATokenToKVPool(KVCache):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int,
                 qk_rope_head_dim: int, layer_num: int, device: str, enable_memory_saver: bool,
                 start_layer: Optional[int] = None, end_layer: Optional[int] = None,
                 use_dsa: bool = False, override_kv_cache_dim: Optional[int] = None):
        super().__init__(size, page_size, dtype, layer_num, device, enable_memory_saver,
                         start_layer, end_layer)
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.use_dsa = use_dsa
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim


class DSATokenToKVPool(MLATokenToKVPool):
    quant_block_size = 128
    index_k_with_scale_buffer_dtype = torch.uint8

    def __init__(self, size: int, page_size: int, kv_lora_rank: int, dtype: torch.dtype,
                 qk_rope_head_dim: int, layer_num: int, device: str, index_head_dim: int,
                 enable_memory_saver: bool, kv_cache_dim: int,
                 start_layer: Optional[int] = None, end_layer: Optional[int] = None,
                 index_buf_size: Optional[int] = None):
        super().__init__(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num,
                         device, enable_memory_saver, start_layer, end_layer, use_dsa=True)
        self.index_head_dim = index_head_dim


class MambaPoolDescriptor:
    """Not an SGLang class: what MambaPoolHost reads of SGLang's MambaPool (the device
    pool of a Mamba/linear-attention model): the number of mamba layers, one temporal
    (SSM) state and the conv states per slot (mamba_cache.temporal / .conv, layer-first
    as SGLang allocates them), the slot count and the device."""

    class State:
        def __init__(self, conv, temporal):
            self.conv, self.temporal = conv, temporal

    def __init__(self, size, num_mamba_layers, conv_shapes, temporal_shape, dtype,
                 device="cpu"):
        self.size = size
        self.num_mamba_layers = num_mamba_layers
        self.device = device
        self.mamba_cache = self.State(
            [torch.zeros((num_mamba_layers, size) + tuple(c), dtype=dtype)
             for c in conv_shapes],
            torch.zeros((num_mamba_layers, size) + tuple(temporal_shape), dtype=dtype))


# ------------------------------------------------------------ host pools

class HostKVCache:
    dcp_size = 1
    dcp_rank = 0

    def __init__(self, device_pool: KVCache, host_to_device_ratio: float, host_size: int,
                 page_size: int, layout: str, pin_memory: bool, device: str,
                 allocator_type: str = "default", dcp_size: int = 1, dcp_rank: int = 0, *,
                 pool_label: str = "kv"):
        self.device_pool = device_pool
        self.pool_label = pool_label
        self.dcp_size = dcp_size
        self.dcp_rank = dcp_rank
        self.page_size = page_size // dcp_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.dtype = device_pool.store_dtype
        self.size_per_token = self.get_size_per_token()
        _size_pool(self, device_pool, host_to_device_ratio, host_size)
        self.start_layer = device_pool.start_layer
        self.end_layer = device_pool.end_layer
        self.kv_buffer = self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def get_size_per_token(self):
        raise NotImplementedError()

    def init_kv_buffer(self):
        raise NotImplementedError()

    def clear(self):
        with self.lock:
            self.mem_state = torch.zeros((self.logical_size,), dtype=torch.uint8)
            self.free_slots = torch.arange(self.logical_size, dtype=torch.int64)
            self.release_slots = []
            self.num_release_slots = 0
            self.slot_used = torch.zeros(self.logical_size, dtype=torch.bool)

    def available_size(self):
        return len(self.free_slots) + self.num_release_slots

    def _merge_release_slots(self):
        if self.num_release_slots:
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])
            self.release_slots, self.num_release_slots = [], 0

    @property
    def logical_size(self) -> int:
        return self.size * self.dcp_size

    @property
    def logical_page_size(self) -> int:
        return self.page_size * self.dcp_size

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        with self.lock:
            assert need_size % self.logical_page_size == 0, "whole pages only"
            if need_size > self.available_size():
                return None
            if need_size > len(self.free_slots):
                self._merge_release_slots()
            select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
            assert not self.slot_used[select].any(), "double alloc"
            self.slot_used[select] = True
            return select

    def free(self, indices: torch.Tensor) -> int:
        with self.lock:
            indices = indices.cpu()
            if indices.numel() == 0:
                return 0
            assert self.slot_used[indices].all(), "double free"
            self.slot_used[indices] = False
            self.release_slots.append(indices)
            self.num_release_slots += len(indices)
            return len(indices)


class MHATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool: MHATokenToKVPool, host_to_device_ratio: float,
                 host_size: int, page_size: int, layout: str, pin_memory: bool = True,
                 device: str = "cpu", allocator_type: str = "default", *,
                 mtp_draft_device_pools=(), pool_label: str = "kv"):
        self.mtp_draft_device_pools = tuple(mtp_draft_device_pools)
        self.target_layer_num = device_pool.layer_num
        super().__init__(device_pool, host_to_device_ratio, host_size, page_size, layout,
                         pin_memory, device, allocator_type, pool_label=pool_label)
        self.element_dim = self.device_pool.head_num * self.device_pool.head_dim

    def get_size_per_token(self):
        self.head_num = self.device_pool.head_num
        self.head_dim = self.device_pool.head_dim
        self.layer_num = self.target_layer_num + len(self.mtp_draft_device_pools)
        return self.head_dim * self.head_num * self.layer_num * _itemsize(self.dtype) * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def init_kv_buffer(self):
        L, H, D, P = self.layer_num, self.head_num, self.head_dim, self.page_size
        dims = {
            "layer_first": (2, L, self.size, H, D),
            "page_first": (2, self.size, L, H, D),
            "page_first_direct": (2, self.page_num, L, P, H, D),
            "page_head": (2, self.page_num, H, P, L, D),
        }.get(self.layout)
        if dims is None:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.token_stride_size = H * D * _itemsize(self.dtype)
        self.layout_dim = self.token_stride_size * L
        return _allocate(self, dims)

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        return _data_page(self, index, flat)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype, device=self.device,
                           pin_memory=self.pin_memory).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        _set_page(self, index, data_page)

    def get_page_buffer_meta(self, indices):
        """Zero-copy metadata: per page, K then V of each layer (layer_first), or the K
        and V halves of the page (the page-major layouts); pointers and byte sizes."""
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.data_ptr()
        item = _itemsize(self.dtype)
        token = self.head_num * self.head_dim * item          # one token of one layer
        v_offset = self.layer_num * self.size * token         # the V half of the buffer
        ptrs = []
        firsts = indices.tolist()[::self.page_size]
        if self.layout == "layer_first":
            for first in firsts:
                for layer in range(self.layer_num):
                    k = base + first * token + layer * self.size * token
                    ptrs += [k, k + v_offset]
            size = self.page_size * token
        elif self.layout in ("page_first", "page_first_direct", "page_head"):
            for first in firsts:
                k = base + first * self.layer_num * token
                ptrs += [k, k + v_offset]
            size = self.page_size * self.layer_num * token
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return ptrs, [size] * len(ptrs)

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        if self.layout not in ("page_first", "page_first_direct", "page_head"):
            return False
        stride = self.page_size * self.layer_num * self.head_num * self.head_dim * \
            _itemsize(self.dtype)
        return self.kv_buffer.data_ptr() % page_size_bytes == 0 and \
            stride % page_size_bytes == 0


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool: MLATokenToKVPool, host_to_device_ratio: float,
                 host_size: int, page_size: int, layout: str, pin_memory: bool = True,
                 device: str = "cpu", allocator_type: str = "default",
                 override_kv_cache_dim: Optional[int] = None, mtp_draft_device_pools=(),
                 dcp_size: int = 1, dcp_rank: int = 0, *, pool_label: str = "kv"):
        self.override_kv_cache_dim = override_kv_cache_dim
        self.mtp_draft_device_pools = tuple(mtp_draft_device_pools)
        super().__init__(device_pool, host_to_device_ratio, host_size, page_size, layout,
                         pin_memory, device, allocator_type, dcp_size=dcp_size,
                         dcp_rank=dcp_rank, pool_label=pool_label)

    def get_size_per_token(self):
        self.kv_lora_rank = self.device_pool.kv_lora_rank
        self.qk_rope_head_dim = self.device_pool.qk_rope_head_dim
        self.target_layer_num = self.device_pool.layer_num
        self.layer_num = self.target_layer_num + len(self.mtp_draft_device_pools)
        self.kv_cache_dim = self.override_kv_cache_dim or (
            self.kv_lora_rank + self.qk_rope_head_dim)
        return self.kv_cache_dim * _itemsize(self.dtype) * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        L, C, P = self.layer_num, self.kv_cache_dim, self.page_size
        dims = {
            "layer_first": (L, self.size, 1, C),
            "page_first": (self.size, L, 1, C),
            "page_first_direct": (self.page_num, L, P, 1, C),
        }.get(self.layout)
        if dims is None:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.token_stride_size = C * _itemsize(self.dtype)
        self.layout_dim = self.token_stride_size * L
        return _allocate(self, dims)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        return _data_page(self, index, flat)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((self.layer_num, self.page_size, 1, self.kv_cache_dim),
                           dtype=self.dtype, device=self.device,
                           pin_memory=self.pin_memory).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        _set_page(self, index, data_page)

    def get_page_buffer_meta(self, indices):
        """Zero-copy metadata: per page, its rows of each layer (layer_first) or the
        whole page (the page-major layouts)."""
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.data_ptr()
        token = self.kv_cache_dim * _itemsize(self.dtype)
        ptrs = []
        firsts = indices.tolist()[::self.page_size]
        if self.layout == "layer_first":
            for first in firsts:
                ptrs += [base + first * token + layer * self.size * token
                         for layer in range(self.layer_num)]
            size = self.page_size * token
        elif self.layout in ("page_first", "page_first_direct"):
            ptrs = [base + first * self.layer_num * token for first in firsts]
            size = self.page_size * self.layer_num * token
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return ptrs, [size] * len(ptrs)

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        if self.layout not in ("page_first", "page_first_direct"):
            return False
        stride = self.page_size * self.layer_num * self.kv_cache_dim * _itemsize(self.dtype)
        return self.kv_buffer.data_ptr() % page_size_bytes == 0 and \
            stride % page_size_bytes == 0


# ------------------------------------------------------------ memory_pool_host.py (hybrid)

class MambaPoolHost(HostKVCache):
    """SGLang's host pool of Mamba states: one slot per page (page_size 1), the temporal
    state and each conv state of every mamba layer, page_first layouts only for storage
    (get_page_buffer_meta: temporal first, then conv_0..conv_n)."""

    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default",
                 layout: str = "layer_first"):
        self.device_pool = device_pool
        self.page_size = 1
        assert layout in ["page_first", "page_first_direct"], f"Unsupported layout: {layout}"
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.num_mamba_layers = device_pool.num_mamba_layers
        self.conv_state_shapes = [c.shape[2:] for c in device_pool.mamba_cache.conv]
        self.temporal_state_shape = device_pool.mamba_cache.temporal.shape[2:]
        self.temporal_state_elem_size = int(torch.Size(self.temporal_state_shape).numel())
        self.conv_state_elem_sizes = [int(torch.Size(c).numel())
                                      for c in self.conv_state_shapes]
        self.conv_dtype = device_pool.mamba_cache.conv[0].dtype
        self.temporal_dtype = device_pool.mamba_cache.temporal.dtype
        self.dtype = self.conv_dtype
        self.size_per_token = self.get_size_per_token()
        _size_pool(self, device_pool, host_to_device_ratio, host_size)
        self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def init_kv_buffer(self):
        L = self.num_mamba_layers
        self.temporal_buffer = torch.zeros((self.size, L, 1) + tuple(self.temporal_state_shape),
                                           dtype=self.temporal_dtype)
        self.conv_buffer = [torch.zeros((self.size, L, 1) + tuple(c), dtype=self.conv_dtype)
                            for c in self.conv_state_shapes]

    def get_hybrid_pool_buffer(self):
        return [self.temporal_buffer, *self.conv_buffer]

    def get_size_per_token(self):
        conv = sum(e * _itemsize(self.conv_dtype) for e in self.conv_state_elem_sizes)
        temporal = self.temporal_state_elem_size * _itemsize(self.temporal_dtype)
        return (conv + temporal) * self.num_mamba_layers

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def _iter_page_tensors(self, index: int):
        yield self.temporal_buffer[index]
        for conv_buf in self.conv_buffer:
            yield conv_buf[index]

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        parts = [t.contiguous().view(torch.uint8).reshape(-1)
                 for t in self._iter_page_tensors(index)]
        return torch.cat(parts)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        flat = data_page.contiguous().view(torch.uint8).reshape(-1)
        start = 0
        for tensor in self._iter_page_tensors(index):
            n = tensor.numel() * tensor.element_size()
            tensor.copy_(flat[start:start + n].view(dtype=tensor.dtype).reshape(tensor.shape))
            start += n

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ["page_first", "page_first_direct"]:
            raise ValueError(
                f"Mamba storage zero-copy requires page_first layout, got {self.layout}")
        L = self.num_mamba_layers
        temporal = L * self.temporal_state_elem_size * _itemsize(self.temporal_dtype)
        convs = [L * e * _itemsize(self.conv_dtype) for e in self.conv_state_elem_sizes]
        ptrs, sizes = [], []
        for index in indices.tolist():
            if self.temporal_state_elem_size > 0:
                ptrs.append(self.temporal_buffer.data_ptr() + index * temporal)
                sizes.append(temporal)
            for buf, size in zip(self.conv_buffer, convs):
                ptrs.append(buf.data_ptr() + index * size)
                sizes.append(size)
        return ptrs, sizes


class DSAIndexerPoolHost(HostKVCache):
    """SGLang's host pool of DSA's indexer keys (fp8 keys with their scales), one page
    per page of its anchor MLA host pool at the same slots (page_first layouts for
    storage: a page is one block of every layer)."""

    def __init__(self, device_pool: DSATokenToKVPool, anchor_host: MLATokenToKVPoolHost,
                 layout: str, pin_memory: bool = True, device: str = "cpu",
                 allocator_type: str = "default"):
        self.device_pool = device_pool
        self.page_size = anchor_host.page_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.dtype = device_pool.store_dtype
        self.start_layer = device_pool.start_layer
        self.end_layer = device_pool.end_layer
        self.target_layer_num = device_pool.layer_num
        self.mtp_draft_device_pools = anchor_host.mtp_draft_device_pools
        self.layer_num = self.target_layer_num + len(self.mtp_draft_device_pools)
        self.index_head_dim = device_pool.index_head_dim
        self.indexer_quant_block_size = device_pool.quant_block_size
        self.indexer_dtype = DSATokenToKVPool.index_k_with_scale_buffer_dtype
        self.indexer_size_per_token = (
            self.index_head_dim + self.index_head_dim // self.indexer_quant_block_size * 4)
        self.size = anchor_host.size
        self.page_num = anchor_host.page_num
        self.indexer_page_stride_size = (
            self.indexer_size_per_token * self.page_size * _itemsize(self.indexer_dtype))
        self.indexer_page_num = (self.size + self.page_size + 1) // self.page_size
        self.size_per_token = (
            self.indexer_size_per_token * self.layer_num * _itemsize(self.indexer_dtype))
        self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def get_size_per_token(self):
        return self.indexer_size_per_token * self.layer_num * _itemsize(self.indexer_dtype)

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        if self.layout == "layer_first":
            dims = (self.layer_num, self.indexer_page_num, self.indexer_page_stride_size)
        elif self.layout in ["page_first", "page_first_direct"]:
            dims = (self.indexer_page_num, self.layer_num, 1, self.indexer_page_stride_size)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.index_k_with_scale_buffer = torch.zeros(dims, dtype=self.indexer_dtype)

    def get_hybrid_pool_buffer(self):
        return [self.index_k_with_scale_buffer]

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ["page_first", "page_first_direct"]:
            raise ValueError(f"Unsupported layout: {self.layout}")
        indices = indices.tolist()
        page_stride_bytes = (self.layer_num * self.indexer_page_stride_size
                             * _itemsize(self.indexer_dtype))
        base_ptr = self.index_k_with_scale_buffer.data_ptr()
        ptr_list = [base_ptr + int(indices[i]) // self.page_size * page_stride_bytes
                    for i in range(0, len(indices), self.page_size)]
        return ptr_list, [page_stride_bytes] * len(ptr_list)


class LogicalHostPool:
    """SGLang's logical anchor (DeepSeek V4): page-aligned token slots and no KV tensor;
    the side pools hold every byte."""

    def __init__(self, size: int, page_size: int, layout: str = "layer_first"):
        if size % page_size != 0:
            raise ValueError("LogicalHostPool size must be page-aligned, "
                             f"got size={size}, page_size={page_size}")
        self.size = size
        self.logical_size = size
        self.page_size = page_size
        self.device = "cpu"
        self.layout = layout
        self.dtype = torch.uint8
        self.layer_num = 0
        self.start_layer = 0
        self.end_layer = 0
        self.kv_buffer = None
        self.size_per_token = 0
        self.allocator = None
        self.can_use_write_back_jit = True
        self.lock = threading.RLock()
        self.clear()

    def clear(self):
        self.free_slots = torch.arange(self.size, dtype=torch.int64)

    def available_size(self):
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > self.available_size():
            return None
        select_index, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select_index

    def get_page_buffer_meta(self, indices):
        return None


@dataclasses.dataclass
class PoolEntry:
    name: PoolName
    host_pool: Any
    device_pool: Any
    layer_mapper: Any
    is_primary_index_anchor: bool = False
    host_evict_fn: Optional[Any] = None
    device_evict_fn: Optional[Any] = None
    device_alloc_fn: Optional[Any] = None
    device_free_fn: Optional[Any] = None


class HostPoolGroup:
    """SGLang's group of a hybrid model's host pools: it answers for its anchor entry
    (the KV pool), and names the others."""

    def __init__(self, entries: list):
        if not entries:
            raise ValueError("HostPoolGroup requires at least one pool entry.")
        self.entries = entries
        self.entry_map = {entry.name: entry for entry in entries}
        self.anchor_entry = next((e for e in entries if e.is_primary_index_anchor),
                                 entries[0])
        self.layout = self.anchor_entry.host_pool.layout
        self.page_size = self.anchor_entry.host_pool.page_size
        self.device = self.anchor_entry.host_pool.device
        self.size = self.anchor_entry.host_pool.size
        self.logical_size = self.anchor_entry.host_pool.logical_size

    @property
    def kv_buffer(self):
        return self.anchor_entry.host_pool.kv_buffer

    @property
    def dtype(self):
        return self.anchor_entry.host_pool.dtype

    def get_pool(self, name: PoolName):
        return self.entry_map[name].host_pool

    def get_page_buffer_meta(self, indices):
        return self.anchor_entry.host_pool.get_page_buffer_meta(indices)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        return self.anchor_entry.host_pool.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        return self.anchor_entry.host_pool.free(indices)

    def get_data_page(self, index, flat: bool = True):
        return self.anchor_entry.host_pool.get_data_page(index, flat)

    def get_dummy_flat_data_page(self):
        return self.anchor_entry.host_pool.get_dummy_flat_data_page()

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        return self.anchor_entry.host_pool.set_from_flat_data_page(index, data_page)


# ------------------------------------------------------------ storage/backend_factory.py

class StorageBackendFactory:
    _registry: Dict[str, Dict[str, Any]] = {}

    @staticmethod
    def _load_backend_class(module_path: str, class_name: str, backend_name: str):
        try:
            backend_class = getattr(importlib.import_module(module_path), class_name)
        except ImportError as e:
            raise ImportError(f"Failed to import backend '{backend_name}' from "
                              f"'{module_path}': {e}") from e
        except AttributeError as e:
            raise AttributeError(f"Class '{class_name}' not found in module "
                                 f"'{module_path}': {e}") from e
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"Backend class {class_name} must inherit from HiCacheStorage")
        return backend_class

    @classmethod
    def register_backend(cls, name: str, module_path: str, class_name: str) -> None:
        cls._registry[name] = {
            "loader": lambda: cls._load_backend_class(module_path, class_name, name),
            "module_path": module_path, "class_name": class_name}

    @classmethod
    def create_backend(cls, backend_name: str, storage_config: HiCacheStorageConfig,
                       mem_pool_host: Any, **kwargs):
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            return cls._create_dynamic_backend(storage_config.extra_config, storage_config,
                                               mem_pool_host, **kwargs)
        raise ValueError(f"Unknown storage backend '{backend_name}'. "
                         f"Registered backends: {list(cls._registry)}. ")

    @classmethod
    def _create_dynamic_backend(cls, backend_config: Dict[str, Any],
                                storage_config: HiCacheStorageConfig, mem_pool_host: Any,
                                **kwargs):
        for name in ("backend_name", "module_path", "class_name"):
            if name not in backend_config:
                raise ValueError(f"Missing required field '{name}' in backend config for "
                                 f"'dynamic' backend")
        backend_class = cls._load_backend_class(backend_config["module_path"],
                                                backend_config["class_name"],
                                                backend_config["backend_name"])
        return backend_class(storage_config, kwargs)


# ------------------------------------------------------------ managers/cache_controller.py

class StorageOperation:
    counter = 0

    def __init__(self, host_indices: Optional[torch.Tensor], token_ids: List[int],
                 last_hash: Optional[str] = None, hash_value: Optional[List[str]] = None,
                 prefix_keys: Optional[List[str]] = None):
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.last_hash = last_hash
        self.completed_tokens = 0
        self.hash_value = hash_value if hash_value is not None else []
        self.prefix_keys = prefix_keys
        self.id = StorageOperation.counter
        StorageOperation.counter += 1


class PrefetchOperation(StorageOperation):
    def __init__(self, request_id: str, token_ids: List[int], last_hash: Optional[str] = None,
                 prefix_keys: Optional[List[str]] = None):
        self.request_id = request_id
        self._lock = threading.Lock()
        self._terminated_flag = False
        self.storage_hit_count = 0
        self.start_time = time.monotonic()
        super().__init__(None, token_ids, last_hash, prefix_keys=prefix_keys)

    def increment(self, num_tokens: int):
        with self._lock:
            if self._terminated_flag:
                return False
            self.completed_tokens += num_tokens
            return True

    def mark_terminate(self):
        with self._lock:
            self._terminated_flag = True

    def is_terminated(self) -> bool:
        return self._terminated_flag


def _storage_batches(operation, page_size):
    """An operation's pages, STORAGE_BATCH_SIZE at a time, with their host indices."""
    for i in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
        batch_hashes = operation.hash_value[i:i + STORAGE_BATCH_SIZE]
        yield batch_hashes, operation.host_indices[i * page_size:
                                                   (i + len(batch_hashes)) * page_size]


class TokenToKVPoolAllocator:
    """What the controller asks of SGLang's allocator (mem_cache/allocator/token.py):
    the device pool."""

    def __init__(self, size: int, dtype: torch.dtype, device: str, kvcache: KVCache,
                 need_sort: bool):
        self.size, self.dtype, self.device = size, dtype, device
        self._kvcache = kvcache

    def get_kvcache(self):
        return self._kvcache


class HiCacheController:
    def __init__(self, token_to_kv_pool_allocator, mem_pool_host: HostKVCache,
                 page_size: int, tp_group, load_cache_event: threading.Event,
                 attn_cp_group=None, attn_tp_group=None, pp_group=None,
                 write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: Optional[str] = None, prefetch_threshold: int = 256,
                 model_name: Optional[str] = None,
                 storage_backend_extra_config: Optional[dict] = None,
                 enable_storage_metrics: bool = False):
        self.tp_group = tp_group
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        self.mem_pool_host = mem_pool_host
        self.write_policy = write_policy
        self.page_size = page_size
        self.io_backend = io_backend
        self.enable_storage = False
        self.storage_backend = None
        self.storage_backend_type = None
        self.enable_storage_metrics = enable_storage_metrics
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        if storage_backend is not None:
            try:
                self.attach_storage_backend(storage_backend=storage_backend,
                                            prefetch_threshold=prefetch_threshold,
                                            model_name=model_name,
                                            storage_backend_extra_config=storage_backend_extra_config)
            except ValueError as e:
                raise ValueError(f"Failed to create storage backend: {e}") from e

    def attach_storage_backend(self, storage_backend: str, prefetch_threshold: int = 256,
                               model_name: Optional[str] = None,
                               storage_backend_extra_config: Optional[dict] = None):
        if self.enable_storage:
            raise RuntimeError("Storage backend already attached.")
        self.storage_backend_type = storage_backend
        self.get_hash_str = get_hash_str
        self.storage_config = self._generate_storage_config(model_name,
                                                            storage_backend_extra_config)
        # MLA: only rank 0 backs pages up.
        self.backup_skip = self.storage_config.is_mla_model and self.storage_config.tp_rank != 0
        self.storage_backend = StorageBackendFactory.create_backend(
            storage_backend, self.storage_config, self.mem_pool_host)
        self.storage_backend.register_mem_pool_host(self.mem_pool_host)
        self.enable_storage = True
        self.prefetch_threshold = max(prefetch_threshold, self.page_size)
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        if storage_backend in ["hf3fs", "mooncake", "eic", "nixl", "simm", "mori"] or (
                storage_backend == "dynamic"
                and bool(self.storage_config.extra_config.get("interface_v1", 0))):
            self.page_get_func = self._page_get_zero_copy
            self.page_set_func = self._page_set_zero_copy

    def detach_storage_backend(self):
        if self.storage_backend is not None and hasattr(self.storage_backend, "close"):
            self.storage_backend.close()
        self.storage_backend = None
        self.storage_backend_type = None
        self.enable_storage = False
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set

    def _generate_storage_config(self, model_name: Optional[str] = None,
                                 storage_backend_extra_config: Optional[dict] = None):
        if storage_backend_extra_config is None:
            storage_backend_extra_config = {}
        parallel = get_parallel()
        self.tp_rank, self.tp_size = parallel.tp_rank, parallel.tp_size
        self.pp_rank, self.pp_size = parallel.pp_rank, parallel.pp_size
        is_mla_model = isinstance(self.mem_pool_device, MLATokenToKVPool)
        tp_lcm_size = storage_backend_extra_config.pop("tp_lcm_size", None)
        return HiCacheStorageConfig(
            tp_rank=self.tp_rank, tp_size=self.tp_size, pp_rank=self.pp_rank,
            pp_size=self.pp_size, attn_cp_rank=0, attn_cp_size=1, is_mla_model=is_mla_model,
            enable_storage_metrics=self.enable_storage_metrics,
            is_page_first_layout=self.mem_pool_host.layout == "page_first",
            model_name=model_name, tp_lcm_size=tp_lcm_size, should_split_heads=False,
            extra_config=storage_backend_extra_config)

    def _page_get_zero_copy(self, operation, hash_values, host_indices, extra_info=None):
        results = self.storage_backend.batch_get_v1(hash_values, host_indices, extra_info)
        inc = 0
        for i in range(len(hash_values)):
            if not results[i]:
                break
            inc += self.page_size
        operation.increment(inc)

    def _generic_page_get(self, operation, hash_values, host_indices, extra_info=None):
        dummy = [self.mem_pool_host.get_dummy_flat_data_page() for _ in hash_values]
        page_data = self.storage_backend.batch_get(hash_values, dummy)
        if page_data is None:
            return
        for i in range(len(hash_values)):
            if page_data[i] is None:
                break
            self.mem_pool_host.set_from_flat_data_page(host_indices[i * self.page_size],
                                                       page_data[i])
            if not operation.increment(self.page_size):
                break

    def _page_transfer(self, operation):
        prefix_keys = operation.prefix_keys
        for batch_hashes, batch_host_indices in _storage_batches(operation, self.page_size):
            prev = operation.completed_tokens
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            self.page_get_func(operation, batch_hashes, batch_host_indices, extra_info)
            if operation.completed_tokens != prev + len(batch_hashes) * self.page_size:
                operation.mark_terminate()
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes

    def _storage_hit_query(self, operation) -> tuple:
        prefix_keys = operation.prefix_keys.copy() if operation.prefix_keys else None
        hash_value, storage_query_count = [], 0
        page_hashes = self.get_hash_str(operation.token_ids, operation.last_hash,
                                        page_size=self.page_size)
        for start in range(0, len(page_hashes), STORAGE_BATCH_SIZE):
            batch_hashes = page_hashes[start:start + STORAGE_BATCH_SIZE]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            hit_page_num = self.storage_backend.batch_exists(batch_hashes, extra_info)
            hash_value.extend(batch_hashes[:hit_page_num])
            storage_query_count += hit_page_num * self.page_size
            if hit_page_num < len(batch_hashes):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes
        return hash_value, storage_query_count

    def _generic_page_set(self, hash_values, host_indices, extra_info=None) -> bool:
        data = [self.mem_pool_host.get_data_page(host_indices[i * self.page_size])
                for i in range(len(hash_values))]
        return self.storage_backend.batch_set(hash_values, data)

    def _page_set_zero_copy(self, hash_values, host_indices, extra_info=None) -> bool:
        return all(self.storage_backend.batch_set_v1(hash_values, host_indices, extra_info))

    def _page_backup(self, operation):
        prefix_keys = operation.prefix_keys
        for batch_hashes, batch_host_indices in _storage_batches(operation, self.page_size):
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if not self.page_set_func(batch_hashes, batch_host_indices, extra_info):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes
            operation.completed_tokens += self.page_size * len(batch_hashes)


# ------------------------------------------------------------ hybrid_cache/hybrid_cache_controller.py

class HybridStorageOperation(StorageOperation):
    """SGLang's hybrid StorageOperation: a backup or prefetch with its side pools'
    PoolTransfers."""

    def __init__(self, host_indices: torch.Tensor, token_ids: List[int],
                 last_hash: Optional[str] = None, hash_value: Optional[List[str]] = None,
                 prefix_keys: Optional[List[str]] = None,
                 pool_transfers: Optional[list] = None):
        super().__init__(host_indices, token_ids, last_hash, hash_value, prefix_keys)
        self.pool_transfers = pool_transfers
        self.pool_storage_result = PoolTransferResult.empty()


class HybridPrefetchOperation(HybridStorageOperation):
    def __init__(self, request_id: str, token_ids: List[int], last_hash: Optional[str] = None,
                 prefix_keys: Optional[List[str]] = None,
                 pool_transfers: Optional[list] = None):
        self.request_id = request_id
        self._lock = threading.Lock()
        self._terminated_flag = False
        self.storage_hit_count = 0
        self.start_time = time.monotonic()
        super().__init__(None, token_ids, last_hash, prefix_keys=prefix_keys,
                         pool_transfers=pool_transfers)
        self.pool_transfers_done = not bool(pool_transfers)

    # The same bodies as the plain PrefetchOperation's (SGLang repeats them).
    def increment(self, num_tokens: int):
        return PrefetchOperation.increment(self, num_tokens)

    def mark_terminate(self):
        PrefetchOperation.mark_terminate(self)

    def is_terminated(self) -> bool:
        return PrefetchOperation.is_terminated(self)


class HybridCacheController(HiCacheController):
    """SGLang's HybridCacheController's storage steps: the host pools registered with
    the backend (register_mem_host_pool_v2), the hit query through batch_exists_v2, the
    side pools read after the KV (batch_get_v2, only when every KV page loaded, with the
    trailing pools' keys re-aligned to the pages hit) and written before it
    (batch_set_v2, then the KV through the base backup)."""

    def __init__(self, token_to_kv_pool_allocator, mem_pool_host, page_size: int,
                 tp_group, load_cache_event: threading.Event, attn_cp_group=None,
                 attn_tp_group=None, pp_group=None,
                 write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: Optional[str] = None, prefetch_threshold: int = 256,
                 model_name: Optional[str] = None,
                 storage_backend_extra_config: Optional[dict] = None,
                 transfer_layer_num: Optional[int] = None,
                 enable_storage_metrics: bool = False):
        super().__init__(token_to_kv_pool_allocator, mem_pool_host, page_size, tp_group,
                         load_cache_event, attn_cp_group, attn_tp_group, pp_group,
                         write_policy, io_backend, None, prefetch_threshold, model_name,
                         storage_backend_extra_config,
                         enable_storage_metrics=enable_storage_metrics)
        if storage_backend is not None:
            self.attach_storage_backend(storage_backend=storage_backend,
                                        prefetch_threshold=prefetch_threshold,
                                        model_name=model_name,
                                        storage_backend_extra_config=storage_backend_extra_config,
                                        host_pools=getattr(mem_pool_host, "entries", None))

    def attach_storage_backend(self, storage_backend: str, prefetch_threshold: int = 256,
                               model_name: Optional[str] = None,
                               storage_backend_extra_config: Optional[dict] = None,
                               host_pools: Optional[list] = None):
        super().attach_storage_backend(storage_backend=storage_backend,
                                       prefetch_threshold=prefetch_threshold,
                                       model_name=model_name,
                                       storage_backend_extra_config=storage_backend_extra_config)
        for entry in host_pools or []:
            self.storage_backend.register_mem_host_pool_v2(entry.host_pool, entry.name)

    def _storage_hit_query(self, operation) -> tuple:
        hash_value = self.get_hash_str(operation.token_ids, operation.last_hash,
                                       page_size=self.page_size)
        extra_info = HiCacheStorageExtraInfo(
            prefix_keys=operation.prefix_keys.copy() if operation.prefix_keys else None)
        if operation.pool_transfers:
            hit_result = self.storage_backend.batch_exists_v2(
                hash_value, operation.pool_transfers, extra_info)
        else:
            kv_hit_count = self.storage_backend.batch_exists(hash_value, extra_info)
            hit_result = PoolTransferResult(kv_hit_pages=kv_hit_count, extra_pool_hit_pages={})
        kv_hit_pages = hit_result.kv_hit_pages
        operation.pool_storage_result.update_kv_hit_pages(kv_hit_pages)
        return hash_value[:kv_hit_pages], kv_hit_pages * self.page_size

    def _page_transfer(self, operation):
        super()._page_transfer(operation)
        kv_completed_pages = operation.completed_tokens // self.page_size
        if (operation.pool_transfers and not operation.is_terminated()
                and kv_completed_pages == len(operation.hash_value)):
            self._sync_trailing_keys(operation.pool_transfers, operation.hash_value,
                                     kv_completed_pages)
            self._resolve_sidecar_derived_pool_transfers(operation)
            results = self.storage_backend.batch_get_v2(operation.pool_transfers)
            operation.pool_storage_result.update_extra_pool_hit_pages(results)
        operation.pool_transfers_done = True

    def _page_backup(self, operation):
        backup_transfers = [t for t in operation.pool_transfers or []
                            if self.should_backup(t)]
        if backup_transfers:
            self._resolve_sidecar_derived_pool_transfers(operation)
            results = self.storage_backend.batch_set_v2(backup_transfers)
            operation.pool_storage_result.update_extra_pool_hit_pages(results)
        if not self.backup_skip:
            super()._page_backup(operation)
        else:
            sidecar_ok = bool(backup_transfers)
            if sidecar_ok:
                for transfer in backup_transfers:
                    result = results.get(transfer.name)
                    if result is None:
                        result = results.get(transfer.name.value)
                    expected = len(transfer.keys or [])
                    if expected == 0 and transfer.host_indices is not None:
                        expected = int(transfer.host_indices.numel())
                    if (not isinstance(result, (list, tuple)) or len(result) != expected
                            or not all(bool(ok) for ok in result)):
                        sidecar_ok = False
                        break
            operation.completed_tokens = (
                len(operation.hash_value) * self.page_size if sidecar_ok else 0)

    def should_backup(self, transfer: PoolTransfer) -> bool:
        if not self.backup_skip:
            return True
        # TP-sharded states are backed up by every rank even beside MLA KV.
        return transfer.name == PoolName.MAMBA

    def _resolve_sidecar_derived_pool_transfers(self, operation):
        for transfer in operation.pool_transfers:
            if transfer.indices_from_pool is None:
                continue
            if transfer.indices_from_pool != PoolName.KV:
                source = next((t for t in operation.pool_transfers
                               if t.indices_from_pool is None
                               and t.name == transfer.indices_from_pool), None)
                if source is None:
                    raise AssertionError("Storage sidecar derived pool source missing: "
                                         f"{transfer.name} from {transfer.indices_from_pool}.")
                transfer.host_indices = source.host_indices
                if transfer.keys is None:
                    transfer.keys = source.keys
            else:
                transfer.host_indices = operation.host_indices
                if transfer.keys is None:
                    transfer.keys = operation.hash_value

    def _sync_trailing_keys(self, pool_transfers: list, all_hashes: list,
                            kv_hit_pages: int) -> None:
        for transfer in pool_transfers:
            if transfer.hit_policy != PoolHitPolicy.TRAILING_PAGES:
                continue
            trailing_n = len(transfer.keys) if transfer.keys else 1
            transfer.keys = all_hashes[max(0, kv_hit_pages - trailing_n):kv_hit_pages]


# ------------------------------------------------------------ helpers for the tests

def make_pools(kind, layout, dtype, *, layers=4, heads=2, head_dim=32, lora=48, rope=16,
               page_size=16, pages=12):
    """A device pool descriptor and its host pool (kind "mha" or "mla")."""
    if kind == "mha":
        dev = MHATokenToKVPool(pages * page_size, page_size, dtype, heads, head_dim, layers,
                               "cpu", False)
        return dev, MHATokenToKVPoolHost(dev, 1.0, 0, page_size, layout, pin_memory=False)
    dev = MLATokenToKVPool(pages * page_size, page_size, dtype, lora, rope, layers, "cpu",
                           False)
    return dev, MLATokenToKVPoolHost(dev, 1.0, 0, page_size, layout, pin_memory=False)


def make_controller(device_pool, host_pool, extra_config, model_name="test/model",
                    enable_storage_metrics=False):
    """A controller with kvengine attached as SGLang's "dynamic" backend."""
    allocator = TokenToKVPoolAllocator(device_pool.size, device_pool.dtype, "cpu", device_pool,
                                       False)
    return HiCacheController(allocator, host_pool,
                             host_pool.page_size, None, threading.Event(),
                             storage_backend="dynamic", model_name=model_name,
                             storage_backend_extra_config=dict(extra_config),
                             enable_storage_metrics=enable_storage_metrics)


def kvengine_extra_config(path=None, attach=None, interface_v1=1, **options):
    extra = {"backend_name": "kvengine", "module_path": "kvengine.sglang",
             "class_name": "KVEngineHiCacheStorage", "interface_v1": interface_v1}
    if path:
        extra["path"] = path
    if attach:
        extra["attach"] = attach
    if options:
        extra["options"] = options
    return extra


def fill_random(host_pool, seed):
    """Fills the whole host buffer with random bytes from seed (every bit pattern, NaNs
    of bf16/fp16 included: the round trip must be bit-exact, not value-equal)."""
    g = torch.Generator().manual_seed(seed)
    raw = host_pool.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.int32).to(torch.uint8))


def page_bytes(host_pool, first_index):
    """The bytes of the page starting at host slot first_index (a copy)."""
    page = host_pool.get_data_page(first_index, flat=True).contiguous()
    return page.view(torch.uint8).numpy().tobytes()
