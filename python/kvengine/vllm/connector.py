"""KVEngineConnector: vLLM's v1 KV connector over a kvengine store.

Load it in vLLM with

    kv_transfer_config={
        "kv_connector": "KVEngineConnector",
        "kv_connector_module_path": "kvengine.vllm.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"path": "/var/lib/kvcache",
                                      "options": {"memory_capacity_bytes": "64GiB"}},
    }

What it stores: one key per vLLM block (per tensor/pipeline rank), whose value is the
block's bytes in every attention layer of that rank, in layer registration order, K then V:

    value = K[layer0] V[layer0] K[layer1] V[layer1] ...      (MLA: one segment per layer)

each segment being the block's (block_size x heads x head_size) elements as they lie in
the cache.  The key (docs/python.md, "Key scheme"):

    <model>@<dtype>@<layout>@bs<block_size>@tp<rank>of<size>@pp<rank>of<size>/<block hash>

where <block hash> is vLLM's chained hash of the block's tokens (hex).  Two instances of the
same model, dtype, layout, block size and parallel shape therefore share blocks; any
difference gives different keys, so different models never collide.

Scheduler side: get_num_new_matched_tokens asks the store (one batch_is_exist over the
request's remaining block keys, for every rank) for the longest present prefix;
build_connector_meta turns the step's scheduler output into picklable metadata.
Worker side: start_load_kv issues the step's loads (one batch_get_into_multi_buffers)
on a background thread; wait_for_layer_load waits for them; wait_for_save saves the
step's newly full blocks (one batch_is_exist to skip those already stored, then one
batch_put_from_multi_buffers).  A block whose load fails is reported by
get_block_ids_with_load_errors so vLLM recomputes it.

One store per process: the scheduler-side and the worker-side connectors of a process
(and every connector naming the same path) share one open DB.
"""

import concurrent.futures
import dataclasses
import logging
import threading
from typing import Any, Optional

import kvengine

from ._vllm_compat import HAVE_VLLM, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole

logger = logging.getLogger("kvengine.vllm")

__all__ = ["KVEngineConnector", "KVEngineConnectorMetadata", "BlockTransfer", "HAVE_VLLM"]


# ------------------------------------------------------------------ metadata


@dataclasses.dataclass
class BlockTransfer:
    """Blocks of one request to load or save: block_ids[i] holds the block hashed
    block_hashes[i] (hex)."""

    req_id: str
    block_ids: list
    block_hashes: list


@dataclasses.dataclass
class KVEngineConnectorMetadata(KVConnectorMetadata):
    """What the scheduler-side connector tells the workers for one step (picklable)."""

    loads: list = dataclasses.field(default_factory=list)  # list[BlockTransfer]
    saves: list = dataclasses.field(default_factory=list)  # list[BlockTransfer]
    preempted_req_ids: list = dataclasses.field(default_factory=list)
    finished_req_ids: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _RequestState:
    """Scheduler-side bookkeeping of one request."""

    request: Any
    block_ids: list = dataclasses.field(default_factory=list)
    saved_blocks: int = 0  # blocks [0, saved_blocks) were handed to the workers to save
    local_computed_tokens: int = 0  # from get_num_new_matched_tokens
    pending_load: Optional[BlockTransfer] = None


# ------------------------------------------------------------------ one store per process

_stores_lock = threading.Lock()
_stores = {}  # path -> [DB, users]


def _acquire_store(path, options):
    with _stores_lock:
        entry = _stores.get(path)
        if entry is None:
            entry = [kvengine.DB(path, **options), 0]
            _stores[path] = entry
        entry[1] += 1
        return entry[0]


def _release_store(path):
    with _stores_lock:
        entry = _stores.get(path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _stores[path]
            entry[0].close()


# ------------------------------------------------------------------ helpers


def _hash_hex(h):
    """vLLM's block hash as hex: bytes (BlockHash, sha256), an int (older vLLM, or the
    builtin hash), or an object with hash_value (older BlockHashType)."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h).hex()
    if isinstance(h, str):
        return h
    if isinstance(h, int):
        return "%x" % (h % (1 << 128))
    if hasattr(h, "hash_value"):
        return _hash_hex(h.hash_value)
    raise TypeError("unsupported block hash type %s" % type(h).__name__)


def _get(obj, name, default=None):
    return getattr(obj, name, default) if obj is not None else default


def _first_group(block_ids):
    """vLLM passes block ids per KV-cache group: tuple[list[int], ...]; the first group is
    the attention group this connector serves."""
    if block_ids is None:
        return []
    if len(block_ids) > 0 and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids)


def _dense_order(tensor, dims):
    """The dims of a tensor sorted from outermost to innermost in memory, when together
    they cover a dense region; None otherwise."""
    pairs = sorted(((tensor.stride(d), tensor.shape[d], d) for d in dims), reverse=True)
    expected = 1
    for stride, size, _ in reversed(pairs):
        if size != 1 and stride != expected:
            return None
        expected *= size
    return [d for _, _, d in pairs]


def _storage_bytes(tensor):
    if hasattr(tensor, "untyped_storage"):  # torch >= 2.0
        return tensor.untyped_storage().nbytes()
    return tensor.storage().nbytes()


@dataclasses.dataclass
class _Layer:
    name: str
    tensor: Any
    flat: Any  # 1-D uint8 view over the tensor's memory (for the staged path)
    base: int  # data_ptr of flat
    segments: list  # per segment: (offset of block 0 in bytes, block stride in bytes)
    seg_bytes: int
    num_blocks: int


# ------------------------------------------------------------------ the connector


class KVEngineConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector backed by kvengine (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        try:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        except TypeError:  # vLLM before kv_cache_config joined the constructor
            super().__init__(vllm_config=vllm_config, role=role)
        kv_config = self._kv_transfer_config
        extra = dict(_get(kv_config, "kv_connector_extra_config", None) or {})
        self._extra = extra
        self._kv_role = _get(kv_config, "kv_role", "kv_both") or "kv_both"

        model_config = _get(vllm_config, "model_config")
        cache_config = _get(vllm_config, "cache_config")
        parallel_config = _get(vllm_config, "parallel_config")
        self._block_size = int(_get(cache_config, "block_size", 16))
        model = extra.get("model_name") or _get(model_config, "model", "model")
        dtype = _get(cache_config, "cache_dtype", "auto")
        if dtype in (None, "auto"):
            dtype = str(_get(model_config, "dtype", "auto")).replace("torch.", "")
        self._layout = str(extra.get("kv_layout", "NHD")).upper()
        self._tp_size = int(_get(parallel_config, "tensor_parallel_size", 1))
        self._pp_size = int(_get(parallel_config, "pipeline_parallel_size", 1))
        self._key_model = "%s@%s@%s@bs%d" % (str(model).replace("/", "--"), dtype,
                                            self._layout, self._block_size)

        self._path = extra.get("path")
        if not self._path:
            raise ValueError("KVEngineConnector needs kv_connector_extra_config['path']")
        self._db = _acquire_store(self._path, dict(extra.get("options", {})))
        self._closed = False

        # Scheduler side.
        self._requests = {}  # req_id -> _RequestState

        # Worker side.
        self._tp_rank, self._pp_rank = self._ranks(extra)
        self._layers = []  # list[_Layer], registration order
        self._layer_names = set()
        self._staged = bool(extra.get("force_staging", False))
        self._value_bytes = 0
        self._executor = None
        self._load_future = None
        self._load_errors = set()
        self.num_loaded_blocks = 0
        self.num_saved_blocks = 0
        self.num_skipped_saves = 0

    # -------------------------------------------------------------- keys
    def _ranks(self, extra):
        tp = extra.get("tp_rank")
        pp = extra.get("pp_rank")
        if (tp is None or pp is None) and HAVE_VLLM and self.role == KVConnectorRole.WORKER:
            try:  # pragma: no cover - needs vLLM's distributed state
                from vllm.distributed.parallel_state import get_pp_group, get_tp_group

                tp = get_tp_group().rank_in_group if tp is None else tp
                pp = get_pp_group().rank_in_group if pp is None else pp
            except Exception:  # noqa: BLE001 -- not initialized: single rank
                pass
        return int(tp or 0), int(pp or 0)

    def block_key(self, block_hash, tp_rank=None, pp_rank=None):
        """The store key of one block of this model on one rank (default: this worker's)."""
        tp = self._tp_rank if tp_rank is None else tp_rank
        pp = self._pp_rank if pp_rank is None else pp_rank
        return "%s@tp%dof%d@pp%dof%d/%s" % (self._key_model, tp, self._tp_size, pp,
                                           self._pp_size, block_hash)

    def _request_hashes(self, request):
        hashes = _get(request, "block_hashes", None)
        if hashes is None:
            return []
        return [_hash_hex(h) for h in hashes]

    def _is_consumer(self):
        return self._kv_role in ("kv_consumer", "kv_both")

    def _is_producer(self):
        return self._kv_role in ("kv_producer", "kv_both")

    # ============================================================== scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(request=request)
        state.request = request
        state.local_computed_tokens = num_computed_tokens
        if not self._is_consumer():
            return 0, False
        hashes = self._request_hashes(request)
        bs = self._block_size
        start = num_computed_tokens // bs
        if start >= len(hashes):
            return 0, False
        ranks = [(t, p) for p in range(self._pp_size) for t in range(self._tp_size)]
        keys = [self.block_key(h, t, p) for h in hashes[start:] for t, p in ranks]
        present = self._db.batch_is_exist(keys)
        hit = 0
        for b in range(len(hashes) - start):
            if all(r == 1 for r in present[b * len(ranks):(b + 1) * len(ranks)]):
                hit += 1
            else:
                break
        matched = (start + hit) * bs
        num_tokens = int(_get(request, "num_tokens", len(_get(request, "prompt_token_ids", []))))
        if matched >= num_tokens:
            matched = num_tokens - 1  # recompute the last token so vLLM gets its logits
        new_tokens = max(0, matched - num_computed_tokens)
        return new_tokens, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(request=request)
        state.request = request
        block_ids = _first_group(blocks.get_block_ids()) if blocks is not None else []
        if block_ids:
            state.block_ids = block_ids
        if num_external_tokens <= 0 or not self._is_consumer():
            return
        bs = self._block_size
        first = state.local_computed_tokens // bs
        last = -(-(state.local_computed_tokens + num_external_tokens) // bs)  # ceil
        hashes = self._request_hashes(request)
        last = min(last, len(hashes), len(state.block_ids))
        state.pending_load = BlockTransfer(request.request_id, state.block_ids[first:last],
                                           hashes[first:last])
        # Blocks loaded from the store need no save.
        state.saved_blocks = max(state.saved_blocks, last)

    def _add_save(self, meta, state, req_id, num_tokens):
        if not self._is_producer():
            return
        hashes = self._request_hashes(state.request)
        full = min(num_tokens // self._block_size, len(hashes), len(state.block_ids))
        if full > state.saved_blocks:
            meta.saves.append(BlockTransfer(req_id, state.block_ids[state.saved_blocks:full],
                                            hashes[state.saved_blocks:full]))
            state.saved_blocks = full

    def _take_load(self, meta, state):
        if state.pending_load is not None:
            load = state.pending_load
            # The block ids may have been (re)allocated after update_state_after_alloc.
            n = len(load.block_ids)
            first = state.local_computed_tokens // self._block_size
            if len(state.block_ids) >= first + n:
                load.block_ids = state.block_ids[first:first + n]
            meta.loads.append(load)
            state.pending_load = None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = KVEngineConnectorMetadata()
        num_scheduled = _get(scheduler_output, "num_scheduled_tokens", {}) or {}

        for new_req in _get(scheduler_output, "scheduled_new_reqs", []) or []:
            state = self._requests.get(new_req.req_id)
            if state is None:
                continue  # never shown to this connector (no block hashes to work with)
            state.block_ids = _first_group(new_req.block_ids)
            self._take_load(meta, state)
            tokens = new_req.num_computed_tokens + num_scheduled.get(new_req.req_id, 0)
            self._add_save(meta, state, new_req.req_id, tokens)

        cached = _get(scheduler_output, "scheduled_cached_reqs")
        if cached is not None:
            resumed_ids = set(_get(cached, "resumed_req_ids", None) or ())
            resumed_flags = _get(cached, "resumed_from_preemption", None)  # older vLLM
            for i, req_id in enumerate(cached.req_ids):
                state = self._requests.get(req_id)
                if state is None:
                    continue
                resumed = req_id in resumed_ids or bool(resumed_flags and resumed_flags[i])
                new_ids = cached.new_block_ids[i]
                if resumed:
                    state.block_ids = _first_group(new_ids)
                elif new_ids is not None:
                    state.block_ids.extend(_first_group(new_ids))
                self._take_load(meta, state)
                tokens = cached.num_computed_tokens[i] + num_scheduled.get(req_id, 0)
                self._add_save(meta, state, req_id, tokens)

        for req_id in _get(scheduler_output, "preempted_req_ids", None) or ():
            meta.preempted_req_ids.append(req_id)
            state = self._requests.get(req_id)
            if state is not None:
                state.pending_load = None
                # Its blocks are freed: the ones not yet saved will be recomputed (and
                # saved then) after it resumes.
                state.block_ids = []
        for req_id in _get(scheduler_output, "finished_req_ids", None) or ():
            meta.finished_req_ids.append(req_id)
            self._requests.pop(req_id, None)
        return meta

    def request_finished(self, request: Any, block_ids: list) -> tuple:
        # Saves are synchronous within the step (wait_for_save), so vLLM may free the
        # blocks at once.
        self._requests.pop(request.request_id, None)
        return False, None

    # ============================================================== worker side
    def register_kv_caches(self, kv_caches: dict) -> None:
        import torch

        layers = []
        for name, t in kv_caches.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError("kv cache of layer %s is not a tensor" % name)
            shape = tuple(t.shape)
            hint = self._extra.get("kv_cache_shape")  # "kv_first" or "blocks_first"
            if t.dim() == 5 and shape[0] == 2 and (shape[1] != 2 or hint != "blocks_first"):
                # FlashAttention: (2, num_blocks, block_size, heads, head_size)
                num_blocks, block_dim = shape[1], 1
                views = [t[0, 0], t[1, 0]]
            elif t.dim() == 5 and shape[1] == 2:
                # blocks first: (num_blocks, 2, block_size, heads, head_size)
                num_blocks, block_dim = shape[0], 0
                views = [t[0, 0], t[0, 1]]
            elif t.dim() == 3:
                # MLA: (num_blocks, block_size, head_size)
                num_blocks, block_dim = shape[0], 0
                views = [t[0]]
            else:
                raise ValueError("kv cache of layer %s has an unsupported shape %s" %
                                 (name, shape))
            order = _dense_order(views[0], range(views[0].dim()))
            if order is None:
                raise ValueError("kv cache of layer %s: a block is not dense in memory" % name)
            if views[0].dim() == 3:
                layout = "NHD" if order == [0, 1, 2] else "HND" if order == [1, 0, 2] else None
                if layout != self._layout:
                    raise ValueError(
                        "kv cache of layer %s is laid out %s inside a block, but the key "
                        "scheme says %s (kv_connector_extra_config['kv_layout'])"
                        % (name, layout or "otherwise", self._layout))
            elt = t.element_size()
            seg_bytes = views[0].numel() * elt
            flat = torch.as_strided(t, (_storage_bytes(t) // elt,), (1,), 0).view(torch.uint8)
            base = flat.data_ptr()
            stride = t.stride(block_dim) * elt
            segments = [(v.data_ptr() - base, stride) for v in views]
            layers.append(_Layer(name, t, flat, base, segments, seg_bytes, num_blocks))
            if t.device.type != "cpu":
                self._staged = True
        self._layers = layers
        self._layer_names = {layer.name for layer in layers}
        self._value_bytes = sum(len(la.segments) * la.seg_bytes for la in layers)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "kvengine-load")

    def _parts(self, block_id):
        ptrs, sizes = [], []
        for la in self._layers:
            if not 0 <= block_id < la.num_blocks:
                raise ValueError("block id %d out of range (%d blocks)" % (block_id,
                                                                          la.num_blocks))
            for off, stride in la.segments:
                ptrs.append(la.base + off + block_id * stride)
                sizes.append(la.seg_bytes)
        return ptrs, sizes

    def _segment_views(self, block_id):
        for la in self._layers:
            for off, stride in la.segments:
                start = off + block_id * stride
                yield la.flat[start:start + la.seg_bytes]

    def _transfers(self, transfers):
        block_ids, keys = [], []
        for tr in transfers:
            for bid, h in zip(tr.block_ids, tr.block_hashes):
                block_ids.append(bid)
                keys.append(self.block_key(h))
        return block_ids, keys

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._finish_load()
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not meta.loads or not self._layers:
            return
        block_ids, keys = self._transfers(meta.loads)
        self._load_future = self._executor.submit(self._load, block_ids, keys)

    def _load(self, block_ids, keys):
        """Runs on the load thread (the store releases the GIL while it copies)."""
        errors = {b for b in block_ids if not self._block_in_range(b)}
        good = [(b, k) for b, k in zip(block_ids, keys) if b not in errors]
        block_ids, keys = [b for b, _ in good], [k for _, k in good]
        if self._staged:
            import torch

            staging = torch.empty((len(keys), self._value_bytes), dtype=torch.uint8)
            results = self._db.batch_get_into(keys, list(staging))
        else:
            parts = [self._parts(b) for b in block_ids]
            results = self._db.batch_get_into_multi_buffers(
                keys, [p for p, _ in parts], [s for _, s in parts])
        for i, (bid, r) in enumerate(zip(block_ids, results)):
            if r != self._value_bytes:
                # The block may hold partial bytes: reported, so vLLM recomputes it.
                errors.add(bid)
                logger.warning("kvengine: load of block %d failed (%s)", bid,
                               kvengine.error_name(r) if r < 0 else "%d bytes" % r)
            elif self._staged:
                off = 0
                for view in self._segment_views(bid):
                    view.copy_(staging[i, off:off + view.numel()])
                    off += view.numel()
        self.num_loaded_blocks += sum(1 for b in block_ids if b not in errors)
        return errors

    def _block_in_range(self, block_id):
        return all(0 <= block_id < la.num_blocks for la in self._layers)

    def _finish_load(self):
        if self._load_future is not None:
            future, self._load_future = self._load_future, None
            try:
                self._load_errors |= future.result()
            except Exception:  # noqa: BLE001 -- every block of the step is then suspect
                logger.exception("kvengine: load failed")
                meta = self._connector_metadata
                if isinstance(meta, KVEngineConnectorMetadata):
                    self._load_errors |= set(self._transfers(meta.loads)[0])

    def wait_for_layer_load(self, layer_name: str) -> None:
        # One batch carries every layer of a block, issued by start_load_kv; the first
        # layer to run waits for it, the others find it done.
        self._finish_load()

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        # A block's value spans every layer, so the put happens once the forward pass is
        # done (wait_for_save); nothing to do per layer.
        return

    def wait_for_save(self) -> None:
        self._finish_load()
        if not self.has_connector_metadata() or not self._layers:
            return
        meta = self._get_connector_metadata()
        if not meta.saves:
            return
        block_ids, keys = self._transfers(meta.saves)
        present = self._db.batch_is_exist(keys)
        todo = [(b, k) for b, k, p in zip(block_ids, keys, present)
                if p != 1 and self._block_in_range(b)]
        self.num_skipped_saves += len(keys) - len(todo)
        if not todo:
            return
        if self._staged:
            import torch

            staging = torch.empty((len(todo), self._value_bytes), dtype=torch.uint8)
            for i, (bid, _) in enumerate(todo):
                off = 0
                for view in self._segment_views(bid):
                    staging[i, off:off + view.numel()].copy_(view)
                    off += view.numel()
            results = self._db.batch_put_from([k for _, k in todo], list(staging))
        else:
            parts = [self._parts(b) for b, _ in todo]
            results = self._db.batch_put_from_multi_buffers(
                [k for _, k in todo], [p for p, _ in parts], [s for _, s in parts])
        failed = [r for r in results if r != 0]
        self.num_saved_blocks += len(results) - len(failed)
        if failed:  # a lost save is a future cache miss, never wrong data
            logger.warning("kvengine: %d of %d block saves failed (%s)", len(failed),
                           len(results), kvengine.error_name(failed[0]))

    def get_finished(self, finished_req_ids: set) -> tuple:
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        self._finish_load()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finish_load()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        _release_store(self._path)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        extra = dict(_get(_get(vllm_config, "kv_transfer_config"),
                          "kv_connector_extra_config", None) or {})
        return extra.get("kv_layout", "NHD").upper()
