"""KVEngineConnector: vLLM's v1 KV connector over a kvengine store.

Load it in vLLM with (docs/vllm.md)

    kv_transfer_config={
        "kv_connector": "KVEngineConnector",
        "kv_connector_module_path": "kvengine.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"path": "/var/lib/kvcache",
                                      "options": {"memory_capacity_bytes": "64GiB"}},
    }

What it stores: one key per vLLM block, per attention layer, per tensor/pipeline rank.  The
value is that layer's bytes of that block, as they lie in the cache (layout.py):

    <model>@<dtype>@<layout tag>@bs<block_size>@tp<r>of<n>@pp<r>of<n>/L<layer>/<block hash>

One value per (block, layer) is what lets the work follow vLLM's forward pass layer by
layer: start_load_kv issues one batch per layer, in layer order, on a load thread, and
wait_for_layer_load(layer i) returns once layer i's batch has landed, while later layers
are still arriving; save_kv_layer(layer i) hands layer i's batch to a save thread while
the next layer is computed, and wait_for_save waits for them.  (A value spanning all
layers would make the first layer wait for the last.)

The layout tag is known only to the workers (it comes from the registered tensors); each
worker publishes it under its engine's id (engine-layout key, below) and the scheduler
side reads it back before its first lookup, so both sides build the same keys.

Scheduler side: get_num_new_matched_tokens asks the store (one batch_is_exist over the
request's remaining blocks, every layer of every rank) for the longest present prefix;
build_connector_meta turns the step's scheduler output into picklable metadata.  A block
whose load fails is reported by get_block_ids_with_load_errors; vLLM then fails the
request or recomputes the block, as kv_load_failure_policy says.

One store per host: the scheduler-side and the worker-side connectors of a process (and
every connector naming the same path) share one handle (SharedStore), and the processes
of the host share the store: the first to open the path serves the others through
kvengine's attach, or all attach to a kv_server ("attach": socket); see docs/vllm.md.
"""

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import tempfile
import threading
import time
from typing import Any, Optional

import kvengine

from ._vllm_compat import (HAVE_VLLM, KVConnectorBase_V1, KVConnectorMetadata,
                           KVConnectorPromMetrics, KVConnectorRole, KVConnectorStats,
                           SupportsHMA, create_metric_per_engine)
from .layout import analyse_layer

logger = logging.getLogger("kvengine.vllm")

__all__ = ["KVEngineConnector", "KVEngineConnectorMetadata", "KVEngineConnectorStats",
           "BlockTransfer", "HAVE_VLLM"]

HASH_SEED_WARNING = (
    "kvengine: PYTHONHASHSEED is not set, so vLLM seeds its block hashes with a random "
    "value in each engine process (init_none_hash): blocks this instance saves are never "
    "found by another vLLM instance or after a restart. Set PYTHONHASHSEED to the same "
    "value (for example PYTHONHASHSEED=0) in the environment of every vLLM instance that "
    "shares this store.")

FAIL_POLICY_WARNING = (
    "kvengine: kv_load_failure_policy is 'fail' (vLLM's default): a block evicted between "
    "the scheduler's lookup and the load fails its request. Set "
    "kv_load_failure_policy='recompute' in kv_transfer_config to recompute it instead.")

_hash_seed_warned = False


# ------------------------------------------------------------------ metadata


@dataclasses.dataclass
class BlockTransfer:
    """Blocks of one request to load or save: position i of the request's run holds
    block block_ids[g][i] in KV-cache group g and is hashed block_hashes[i] (hex)."""

    req_id: str
    block_ids: list  # one list per KV-cache group
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
    block_ids: list = dataclasses.field(default_factory=list)  # per group
    saved_blocks: int = 0  # blocks [0, saved_blocks) were handed to the workers to save
    local_computed_tokens: int = 0  # from get_num_new_matched_tokens
    pending_load: Optional[BlockTransfer] = None


# ------------------------------------------------------------------ stats and metrics

_SUMMED = ("lookup_tokens", "hit_tokens", "loaded_blocks", "loaded_bytes", "load_errors",
           "saved_blocks", "saved_bytes", "skipped_saves", "failed_saves")
_LISTED = ("load_seconds", "save_seconds")


class KVEngineConnectorStats(KVConnectorStats):
    """Counters of one interval (data is a plain dict, so it pickles across processes):
    sums in _SUMMED, and one duration per step in _LISTED (seconds)."""

    def __init__(self, data: Optional[dict] = None):
        super().__init__(data=dict(data) if data else {})
        for k in _SUMMED:
            self.data.setdefault(k, 0)
        for k in _LISTED:
            self.data[k] = list(self.data.get(k, []))

    def reset(self):
        self.data = {}
        self.__init__()

    def add(self, **values):
        for k, v in values.items():
            if k in _LISTED:
                self.data[k].append(v)
            else:
                self.data[k] += v

    def aggregate(self, other: "KVEngineConnectorStats") -> "KVEngineConnectorStats":
        for k in _SUMMED:
            self.data[k] += other.data.get(k, 0)
        for k in _LISTED:
            self.data[k].extend(other.data.get(k, []))
        return self

    def reduce(self) -> dict:
        out = {k: self.data[k] for k in _SUMMED}
        for k in _LISTED:
            v = self.data[k]
            out["avg_" + k] = round(sum(v) / len(v), 6) if v else 0.0
        return out

    def is_empty(self) -> bool:
        return not any(self.data[k] for k in _SUMMED) and not any(self.data[k]
                                                                  for k in _LISTED)


class KVEnginePromMetrics(KVConnectorPromMetrics):
    """Prometheus counters of hit tokens and moved bytes, histograms of step load and save
    times, one child per engine (vLLM's 'engine' label values)."""

    _COUNTERS = (("hit_tokens", "Prompt tokens found in kvengine by the scheduler"),
                 ("loaded_bytes", "Bytes loaded from kvengine into the KV cache"),
                 ("saved_bytes", "Bytes saved from the KV cache into kvengine"),
                 ("load_errors", "Blocks whose load from kvengine failed"))
    _HISTOGRAMS = (("load_seconds", "Time from start_load_kv to every layer loaded"),
                   ("save_seconds", "Time from the first save_kv_layer to wait_for_save"))
    _BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                2.5, 5.0)

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {}
        for name, doc in self._COUNTERS:
            metric = self._counter_cls(name="vllm:kvengine_" + name, documentation=doc,
                                       labelnames=labelnames)
            self.counters[name] = create_metric_per_engine(metric, per_engine_labelvalues)
        self.histograms = {}
        for name, doc in self._HISTOGRAMS:
            metric = self._histogram_cls(name="vllm:kvengine_" + name, documentation=doc,
                                         buckets=list(self._BUCKETS), labelnames=labelnames)
            self.histograms[name] = create_metric_per_engine(metric, per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
        for name, per_engine in self.counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                per_engine[engine_idx].inc(value)
        for name, per_engine in self.histograms.items():
            for value in transfer_stats_data.get(name, []):
                per_engine[engine_idx].observe(value)


# ------------------------------------------------------------------ one store per host

IO_ERROR = -4  # kvengine's IOError code: what an attached store's calls return when its
#                owner is gone


def default_socket(path):
    """The Unix socket the first process opening path serves the others on: inside the
    DB directory, or (a socket path is limited to 107 bytes) in the temporary directory,
    named after the directory's absolute path."""
    path = os.path.abspath(path)
    inside = os.path.join(path, "local.sock")
    if len(inside.encode()) <= 100:
        return inside
    digest = hashlib.sha1(path.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "kvengine-%s.sock" % digest)


def _lost_owner(result):
    if isinstance(result, int):
        return result == IO_ERROR
    return isinstance(result, list) and len(result) > 0 and all(r == IO_ERROR for r in result)


class SharedStore:
    """One process's handle on a store that every process of the host shares
    (docs/vllm.md, "One store per host"), with the DB's methods.

    attach=SOCKET: a kv_server (or any process) serves the store on SOCKET; calls made
    while it is gone fail with IOError, and the engine reconnects by itself once it
    serves again.  Otherwise the first process that opens path owns the store and serves
    the others on options["local_listen"] (default_socket(path) unless given; "" turns
    sharing off).  When that owner goes away, the first call of an attached process that
    fails with IOError tries to take the store over: it opens path itself, becoming the
    owner (what the old owner flushed to SSD is there) or attaching to whichever process
    did first, and the call is made once more."""

    def __init__(self, path=None, attach=None, options=None, takeover_timeout_s=10.0):
        self._path = path
        self._attach = attach
        self._options = dict(options or {})
        self._takeover_timeout_s = takeover_timeout_s
        self._lock = threading.Lock()
        self._generation = 0
        if attach:
            self._db = kvengine.attach(attach, **self._options)
        else:
            if "local_listen" not in self._options:
                self._options["local_listen"] = default_socket(path)
            self._db = self._open()

    def _open(self):
        deadline = time.monotonic() + self._takeover_timeout_s
        while True:
            try:
                return kvengine.DB(self._path, **self._options)
            except kvengine.Error as e:
                # Busy: the directory is held by an owner that does not serve (yet): one
                # starting, or one closing and flushing.
                if e.code != -6 or not self._options.get("local_listen") or \
                        time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    @property
    def attached(self):
        """The socket this process is attached through; None when it owns the store."""
        return self._db.get_property("kvengine.attached")

    def _take_over(self, generation):
        """After a call saw the owner gone: makes sure a store is reachable again (a new
        owner, maybe this process).  False when none is."""
        with self._lock:
            if generation != self._generation:
                return True  # another thread did it
            db = self._db
            if db.is_exist("kvengine/owner-probe") >= 0:
                return True  # an owner serves again: the engine reconnected
            if self._attach or db.get_property("kvengine.attached") is None:
                return False  # a kv_server is restarted from outside; an owner's own error
            try:
                self._db = self._open()
            except kvengine.Error as e:
                logger.warning("kvengine: the store's owner is gone and %s could not be "
                               "opened: %s", self._path, e)
                return False
            self._generation += 1
            logger.warning("kvengine: the store's owner went away; this process %s %s",
                           "attached to the new owner of" if self.attached else "now owns",
                           self._path)
            # The old handle is dropped, not closed: other threads may be in a call on it.
            return True

    def __getattr__(self, name):
        method_name = name

        def call(*args):
            generation = self._generation
            result = getattr(self._db, method_name)(*args)
            if _lost_owner(result) and self._take_over(generation):
                result = getattr(self._db, method_name)(*args)
            return result

        return call

    def close(self):
        with self._lock:
            return self._db.close()


_stores_lock = threading.Lock()
_stores = {}  # path or socket -> [SharedStore, users]


def _acquire_store(path, attach, options):
    name = attach or path
    with _stores_lock:
        entry = _stores.get(name)
        if entry is None:
            entry = [SharedStore(path, attach, options), 0]
            _stores[name] = entry
        entry[1] += 1
        return entry[0]


def _release_store(name):
    with _stores_lock:
        entry = _stores.get(name)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _stores[name]
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


def _groups(block_ids):
    """vLLM passes block ids per KV-cache group, tuple[list[int], ...] (older vLLM: one
    flat list); returned as a list of lists."""
    if block_ids is None:
        return []
    if len(block_ids) > 0 and isinstance(block_ids[0], (list, tuple)):
        return [list(g) for g in block_ids]
    return [list(block_ids)]


def _storage_bytes(tensor):
    if hasattr(tensor, "untyped_storage"):  # torch >= 2.0
        return tensor.untyped_storage().nbytes()
    return tensor.storage().nbytes()


@dataclasses.dataclass
class _Layer:
    name: str
    index: int  # registration order: the L<index> of the key
    group: int  # KV-cache group whose block ids address this layer
    tensor: Any
    flat: Any  # 1-D uint8 view over the tensor's memory (for the staged path)
    base: int  # data_ptr of flat
    offset: int  # bytes from base to block 0
    geometry: Any  # layout.LayerGeometry

    def parts(self, block_id):
        """Addresses and sizes of the block's bytes in this layer."""
        g = self.geometry
        if not 0 <= block_id < g.num_blocks:
            raise ValueError("block id %d out of range (%d blocks)" % (block_id, g.num_blocks))
        start = self.base + self.offset + block_id * g.block_stride
        return [start + s for s in g.segments], [g.segment_bytes] * len(g.segments)

    def views(self, block_id):
        g = self.geometry
        start = self.offset + block_id * g.block_stride
        return [self.flat[start + s:start + s + g.segment_bytes] for s in g.segments]


class _LoadJob:
    """One step's loads: one batch per layer, in layer order, on the load thread; an
    event per layer tells wait_for_layer_load when that layer has landed."""

    def __init__(self, num_layers, positions):
        self.events = [threading.Event() for _ in range(num_layers)]
        self.positions = positions  # [(block ids per group, hash hex)]
        self.errors = set()  # failed positions (indexes into positions)
        self.started = time.perf_counter()
        self.future = None


# ------------------------------------------------------------------ the connector


class KVEngineConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM v1 KV connector backed by kvengine (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM before kv_cache_config joined the constructor
            super().__init__(vllm_config, role)
            self._kv_cache_config = kv_cache_config
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
        self._tp_size = int(_get(parallel_config, "tensor_parallel_size", 1))
        self._pp_size = int(_get(parallel_config, "pipeline_parallel_size", 1))
        self._key_model = "%s@%s" % (str(model).replace("/", "--"), dtype)
        # The instance's id, shared by its scheduler and its workers (vLLM: a uuid per
        # instance unless set); it names the layout record the workers publish.
        self._engine_id = str(extra.get("engine_id") or _get(kv_config, "engine_id", None)
                              or "default")

        self._path = extra.get("path")
        self._attach = extra.get("attach")
        if not self._path and not self._attach:
            raise ValueError("KVEngineConnector needs kv_connector_extra_config['path'] "
                             "(or ['attach'], the socket of a kv_server)")
        self._store_name = self._attach or self._path
        self._db = _acquire_store(self._path, self._attach, dict(extra.get("options", {})))
        self._closed = False
        self._stats = KVEngineConnectorStats()
        self._stats_lock = threading.Lock()

        # Scheduler side.
        self._requests = {}  # req_id -> _RequestState
        self._rank_layouts = {}  # (tp, pp) -> (layout tag, number of layers)
        if role == KVConnectorRole.SCHEDULER:
            self._warn_at_start(kv_config)

        # Worker side.
        self._tp_rank, self._pp_rank = self._ranks(extra)
        self._layers = []  # list[_Layer], registration order
        self._by_name = {}
        self._layout_tag = None
        # Staged: blocks go through a host tensor (pinned where CUDA is) instead of their
        # own addresses.  Only for caches the engine cannot reach: CUDA caches go to the
        # engine as they are in a CUDA build (its GPU staging path, docs/gpu.md).
        self._staged = bool(extra.get("force_staging", False))
        self._on_cuda = False  # the caches are CUDA memory: saves wait for the compute
        self._load_executor = None
        self._save_executor = None
        self._load_job = None
        self._save_plan = None  # this step's [(block ids per group, hash hex)] to save
        self._save_futures = {}  # layer index -> Future
        self._save_started = None
        self._load_errors = set()
        self.num_loaded_blocks = 0
        self.num_saved_blocks = 0
        self.num_skipped_saves = 0

    def _warn_at_start(self, kv_config):
        global _hash_seed_warned
        # Every configuration shares: the store outlives the process and may be shared by
        # other instances or peers; a random hash seed makes all of that miss.
        if os.environ.get("PYTHONHASHSEED") is None and not _hash_seed_warned:
            _hash_seed_warned = True
            logger.warning(HASH_SEED_WARNING)
        policy = _get(kv_config, "kv_load_failure_policy", None)
        if policy == "fail" and self._is_consumer():
            logger.warning(FAIL_POLICY_WARNING)

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

    def _rank_prefix(self, tag, tp, pp):
        return "%s@%s@bs%d@tp%dof%d@pp%dof%d" % (self._key_model, tag, self._block_size, tp,
                                                self._tp_size, pp, self._pp_size)

    def _layout_record_key(self, tp, pp):
        return "%s@bs%d@tp%dof%d@pp%dof%d/engine-layout/%s" % (
            self._key_model, self._block_size, tp, self._tp_size, pp, self._pp_size,
            self._engine_id)

    def _rank_layout(self, tp, pp):
        """(layout tag, number of layers) of one rank of this instance, as its worker
        published it; None until that worker has registered its caches."""
        if (tp, pp) == (self._tp_rank, self._pp_rank) and self._layout_tag is not None:
            return self._layout_tag, len(self._layers)
        found = self._rank_layouts.get((tp, pp))
        if found is None:
            raw = self._db.get(self._layout_record_key(tp, pp))
            if not raw:
                return None
            tag, count = bytes(raw).decode().split("\n")
            found = self._rank_layouts[(tp, pp)] = (tag, int(count))
        return found

    def block_key(self, block_hash, layer=0, tp_rank=None, pp_rank=None):
        """The store key of one block of one layer on one rank (default: this worker's);
        None while that rank's layout is unknown."""
        tp = self._tp_rank if tp_rank is None else tp_rank
        pp = self._pp_rank if pp_rank is None else pp_rank
        layout = self._rank_layout(tp, pp)
        if layout is None:
            return None
        return "%s/L%d/%s" % (self._rank_prefix(layout[0], tp, pp), layer, block_hash)

    def _request_hashes(self, request):
        hashes = _get(request, "block_hashes", None)
        if hashes is None:
            return []
        return [_hash_hex(h) for h in hashes]

    def _publishable(self, request, count):
        """vLLM main: only the first num_publishable_block_hashes hashes of a request may
        be stored by content (the rest may still change, e.g. EAGLE's draft KV)."""
        limit = _get(request, "num_publishable_block_hashes", None)
        return count if limit is None else min(count, int(limit))

    def _is_consumer(self):
        return self._kv_role in ("kv_consumer", "kv_both")

    def _is_producer(self):
        return self._kv_role in ("kv_producer", "kv_both")

    def _record(self, **values):
        with self._stats_lock:
            self._stats.add(**values)

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
        layouts = [self._rank_layout(t, p) for t, p in ranks]
        if any(la is None for la in layouts):
            logger.debug("kvengine: no layout published yet for engine %s", self._engine_id)
            return 0, False
        prefixes = [(self._rank_prefix(tag, t, p), n) for (t, p), (tag, n) in zip(ranks, layouts)]
        per_block = sum(n for _, n in prefixes)
        keys = ["%s/L%d/%s" % (prefix, layer, h) for h in hashes[start:]
                for prefix, n in prefixes for layer in range(n)]
        present = self._db.batch_is_exist(keys)
        hit = 0
        for b in range(len(hashes) - start):
            if all(r == 1 for r in present[b * per_block:(b + 1) * per_block]):
                hit += 1
            else:
                break
        matched = (start + hit) * bs
        num_tokens = int(_get(request, "num_tokens", len(_get(request, "prompt_token_ids", []))))
        if matched >= num_tokens:
            matched = num_tokens - 1  # recompute the last token so vLLM gets its logits
        new_tokens = max(0, matched - num_computed_tokens)
        self._record(lookup_tokens=max(0, num_tokens - num_computed_tokens),
                     hit_tokens=new_tokens)
        return new_tokens, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(request=request)
        state.request = request
        block_ids = _groups(blocks.get_block_ids()) if blocks is not None else []
        if block_ids and any(block_ids):
            state.block_ids = block_ids
        if num_external_tokens <= 0 or not self._is_consumer():
            return
        bs = self._block_size
        first = state.local_computed_tokens // bs
        last = -(-(state.local_computed_tokens + num_external_tokens) // bs)  # ceil
        hashes = self._request_hashes(request)
        last = min([last, len(hashes)] + [len(g) for g in state.block_ids])
        state.pending_load = BlockTransfer(request.request_id,
                                           [g[first:last] for g in state.block_ids],
                                           hashes[first:last])
        # Blocks loaded from the store need no save.
        state.saved_blocks = max(state.saved_blocks, last)

    def _add_save(self, meta, state, req_id, num_tokens):
        if not self._is_producer():
            return
        hashes = self._request_hashes(state.request)
        full = min([num_tokens // self._block_size, len(hashes)]
                   + [len(g) for g in state.block_ids])
        full = self._publishable(state.request, full)
        if full > state.saved_blocks:
            meta.saves.append(BlockTransfer(req_id,
                                            [g[state.saved_blocks:full] for g in state.block_ids],
                                            hashes[state.saved_blocks:full]))
            state.saved_blocks = full

    def _take_load(self, meta, state):
        if state.pending_load is not None:
            load = state.pending_load
            # The block ids may have been (re)allocated after update_state_after_alloc.
            n = len(load.block_hashes)
            first = state.local_computed_tokens // self._block_size
            if state.block_ids and all(len(g) >= first + n for g in state.block_ids):
                load.block_ids = [g[first:first + n] for g in state.block_ids]
            meta.loads.append(load)
            state.pending_load = None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = KVEngineConnectorMetadata()
        num_scheduled = _get(scheduler_output, "num_scheduled_tokens", {}) or {}

        for new_req in _get(scheduler_output, "scheduled_new_reqs", []) or []:
            state = self._requests.get(new_req.req_id)
            if state is None:
                continue  # never shown to this connector (no block hashes to work with)
            state.block_ids = _groups(new_req.block_ids)
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
                    state.block_ids = _groups(new_ids)
                elif new_ids is not None:
                    new_groups = _groups(new_ids)
                    if not state.block_ids:
                        state.block_ids = [[] for _ in new_groups]
                    for g, ids in enumerate(new_groups):
                        state.block_ids[g].extend(ids)
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
        # Saves finish within the step (wait_for_save), so vLLM may free the blocks now.
        self._requests.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: tuple) -> tuple:
        # SupportsHMA: the same for every KV-cache group.
        return self.request_finished(request, [])

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a dropped save is a later miss, never a lost hand-off.
        return False

    def get_finished_count(self) -> Optional[int]:
        # Loads and saves complete within the step; nothing finishes asynchronously, so
        # vLLM's default count (the world size) is never consulted.
        return None

    def reset_cache(self) -> Optional[bool]:
        """vLLM's reset_prefix_cache: forget this model's blocks in the store (every rank
        and layout of this model and dtype; other models, and the layout records the
        workers published, are untouched)."""
        pattern = _regex_escape(self._key_model) + "@[^/]*/L[0-9]+/.*"  # a full match
        removed = self._db.remove_by_regex(pattern)
        if removed < 0:
            logger.warning("kvengine: reset_cache failed (%s)", kvengine.error_name(removed))
            return False
        return True

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        with self._stats_lock:
            if self._stats.is_empty():
                return None
            stats, self._stats = self._stats, KVEngineConnectorStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None) -> Optional[KVConnectorStats]:
        return KVEngineConnectorStats(data=data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                           per_engine_labelvalues: dict):
        return KVEnginePromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)

    # ============================================================== worker side
    def register_kv_caches(self, kv_caches: dict) -> None:
        import torch

        group_of = {}
        for g, group in enumerate(_get(self._kv_cache_config, "kv_cache_groups", None) or []):
            for name in _get(group, "layer_names", None) or []:
                group_of[name] = g
        num_blocks = _get(self._kv_cache_config, "num_blocks", None)
        layers = []
        for index, (name, t) in enumerate(kv_caches.items()):
            if not isinstance(t, torch.Tensor):
                raise TypeError("kv cache of layer %s is not a tensor" % name)
            geometry = analyse_layer(name, t, self._block_size, num_blocks,
                                     self._extra.get("kv_cache_shape"))
            elt = t.element_size()
            flat = torch.as_strided(t, (_storage_bytes(t) // elt,), (1,), 0).view(torch.uint8)
            base = flat.data_ptr()
            layers.append(_Layer(name, index, group_of.get(name, 0), t, flat, base,
                                 t.data_ptr() - base, geometry))
            if t.device.type == "cuda":
                self._on_cuda = True
            if t.device.type != "cpu" and not (t.device.type == "cuda" and kvengine.CUDA_BUILD):
                self._staged = True
        self._layers = layers
        self._by_name = {layer.name: layer for layer in layers}
        tags = []
        for layer in layers:
            if layer.geometry.tag not in tags:
                tags.append(layer.geometry.tag)
        self._layout_tag = "+".join(tags)
        self._publish_layout()
        if self._load_executor is None:
            self._load_executor = concurrent.futures.ThreadPoolExecutor(1, "kvengine-load")
            self._save_executor = concurrent.futures.ThreadPoolExecutor(1, "kvengine-save")
        logger.info("kvengine: %d layers, layout %s, %d bytes per block and layer",
                    len(layers), self._layout_tag,
                    layers[0].geometry.block_bytes if layers else 0)

    def _publish_layout(self):
        """Tells this instance's scheduler-side connector (possibly another process) how
        this rank's keys are formed."""
        record = ("%s\n%d" % (self._layout_tag, len(self._layers))).encode()
        rc = self._db.put(self._layout_record_key(self._tp_rank, self._pp_rank), record)
        if rc != 0:
            raise RuntimeError("kvengine: cannot publish the cache layout (%s)"
                               % kvengine.error_name(rc))

    def _positions(self, transfers):
        """[(block ids per group, hash hex)] of the transfers, one per block position."""
        out = []
        for tr in transfers:
            groups = _groups(tr.block_ids)
            for i, h in enumerate(tr.block_hashes):
                out.append(([g[i] for g in groups], h))
        return out

    def _in_range(self, layer, ids):
        return layer.group < len(ids) and 0 <= ids[layer.group] < layer.geometry.num_blocks

    def _layer_key(self, layer, block_hash):
        return "%s/L%d/%s" % (self._rank_prefix(self._layout_tag, self._tp_rank,
                                                self._pp_rank), layer.index, block_hash)

    # ---------------------------------------------------------------- loads
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._finish_load()
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not getattr(meta, "loads", None) or not self._layers:
            return
        job = _LoadJob(len(self._layers), self._positions(meta.loads))
        job.future = self._load_executor.submit(self._run_load, job)
        self._load_job = job

    def _run_load(self, job):
        """The load thread: one batch per layer, in layer order (the store releases the
        GIL while it copies, so the forward pass runs meanwhile)."""
        loaded_bytes = 0
        try:
            for layer, event in zip(self._layers, job.events):
                todo = [i for i, (ids, _) in enumerate(job.positions)
                        if i not in job.errors and self._in_range(layer, ids)]
                job.errors.update(i for i, (ids, _) in enumerate(job.positions)
                                  if not self._in_range(layer, ids))
                loaded_bytes += self._load_layer(layer, job, todo)
                event.set()
        finally:
            for event in job.events:  # never leave a waiter behind, even on an error
                event.set()
            self._record(load_seconds=time.perf_counter() - job.started,
                         loaded_bytes=loaded_bytes,
                         loaded_blocks=len(job.positions) - len(job.errors),
                         load_errors=len(job.errors))
        return job

    def _load_layer(self, layer, job, todo):
        if not todo:
            return 0
        keys = [self._layer_key(layer, job.positions[i][1]) for i in todo]
        want = layer.geometry.block_bytes
        if self._staged:
            import torch

            staging = torch.empty((len(todo), want), dtype=torch.uint8,
                                  pin_memory=self._on_cuda)
            results = self._db.batch_get_into(keys, list(staging))
        else:
            parts = [layer.parts(job.positions[i][0][layer.group]) for i in todo]
            results = self._db.batch_get_into_multi_buffers(
                keys, [p for p, _ in parts], [s for _, s in parts])
        done = 0
        for row, (i, r) in enumerate(zip(todo, results)):
            if r != want:
                # The block may hold partial bytes: reported, so vLLM fails or recomputes it.
                job.errors.add(i)
                logger.warning("kvengine: load of block %s of layer %s failed (%s)",
                               job.positions[i][0], layer.name,
                               kvengine.error_name(r) if r < 0 else "%d bytes" % r)
                continue
            if self._staged:
                off = 0
                for view in layer.views(job.positions[i][0][layer.group]):
                    view.copy_(staging[row, off:off + view.numel()])
                    off += view.numel()
            done += want
        return done

    def _finish_load(self):
        job, self._load_job = self._load_job, None
        if job is None:
            return
        try:
            job.future.result()
        except Exception:  # noqa: BLE001 -- every block of the step is then suspect
            logger.exception("kvengine: load failed")
            job.errors.update(range(len(job.positions)))
        failed = {b for i in job.errors for b in job.positions[i][0]}
        self.num_loaded_blocks += len(job.positions) - len(job.errors)
        self._load_errors |= failed

    def wait_for_layer_load(self, layer_name: str) -> None:
        job = self._load_job
        layer = self._by_name.get(layer_name)
        if job is None or layer is None:
            return
        job.events[layer.index].wait()

    # ---------------------------------------------------------------- saves
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        layer = self._by_name.get(layer_name)
        if layer is None or layer.index in self._save_futures:
            return
        plan = self._step_saves()
        if plan:
            # The layer's attention wrote its blocks on the current CUDA stream: the save
            # thread reads them once that work is done, while the next layer computes.
            written = self._cuda_work_done() if self._on_cuda else None
            self._save_futures[layer.index] = self._save_executor.submit(
                self._save_layer, layer, plan, written)

    def _step_saves(self):
        if self._save_plan is None:
            self._save_plan = []
            if self.has_connector_metadata() and self._layers:
                meta = self._get_connector_metadata()
                self._save_plan = self._positions(getattr(meta, "saves", None) or [])
                self._save_started = time.perf_counter()
        return self._save_plan

    @staticmethod
    def _cuda_work_done():
        """An event recorded on the current CUDA stream: done once the work queued so far
        (the attention that wrote the blocks) is."""
        import torch

        event = torch.cuda.Event()
        event.record()
        return event

    def _save_layer(self, layer, plan, written=None):
        """The save thread: one layer's newly full blocks, skipping those stored already.
        `written`, a CUDA event, marks the end of the work that wrote them."""
        if written is not None:
            written.synchronize()
        todo = [(ids[layer.group], h) for ids, h in plan if self._in_range(layer, ids)]
        keys = [self._layer_key(layer, h) for _, h in todo]
        present = self._db.batch_is_exist(keys)
        todo = [(b, k) for (b, _), k, p in zip(todo, keys, present) if p != 1]
        skipped = len(keys) - len(todo)
        if not todo:
            return 0, 0, skipped
        if self._staged:
            import torch

            staging = torch.empty((len(todo), layer.geometry.block_bytes), dtype=torch.uint8,
                                  pin_memory=self._on_cuda)
            for row, (bid, _) in enumerate(todo):
                off = 0
                for view in layer.views(bid):
                    staging[row, off:off + view.numel()].copy_(view)
                    off += view.numel()
            results = self._db.batch_put_from([k for _, k in todo], list(staging))
        else:
            parts = [layer.parts(b) for b, _ in todo]
            results = self._db.batch_put_from_multi_buffers(
                [k for _, k in todo], [p for p, _ in parts], [s for _, s in parts])
        failed = [r for r in results if r != 0]
        if failed:  # a lost save is a future cache miss, never wrong data
            logger.warning("kvengine: %d of %d saves of layer %s failed (%s)", len(failed),
                           len(results), layer.name, kvengine.error_name(failed[0]))
        return len(results) - len(failed), len(failed), skipped

    def wait_for_save(self):
        self._finish_load()
        plan = self._step_saves()
        try:
            if not plan:
                return
            written = self._cuda_work_done() if self._on_cuda else None
            for layer in self._layers:  # layers vLLM did not hand to save_kv_layer
                if layer.index not in self._save_futures:
                    self._save_futures[layer.index] = self._save_executor.submit(
                        self._save_layer, layer, plan, written)
            saved = failed = skipped = 0
            for index in sorted(self._save_futures):
                s, f, k = self._save_futures[index].result()
                saved, failed, skipped = saved + s, failed + f, skipped + k
            # Block counts are per position; bytes add up over the layers.
            per_block = sum(la.geometry.block_bytes for la in self._layers)
            blocks = saved // max(1, len(self._layers))
            self.num_saved_blocks += blocks
            self.num_skipped_saves += skipped // max(1, len(self._layers))
            self._record(saved_blocks=blocks, saved_bytes=blocks * per_block,
                         skipped_saves=skipped // max(1, len(self._layers)),
                         failed_saves=failed,
                         save_seconds=time.perf_counter() - self._save_started)
        finally:
            self._save_plan = None
            self._save_futures = {}

    def get_finished(self, finished_req_ids: set) -> tuple:
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        self._finish_load()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        self._finish_load()
        for executor in (self._load_executor, self._save_executor):
            if executor is not None:
                executor.shutdown(wait=True)
        _release_store(self._store_name)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        # Any layout works (the key names it), so the connector asks for none.
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        # Every load waits per layer (wait_for_layer_load) and every save is queued per
        # layer (save_kv_layer), from the attention layers' hooks: a full CUDA graph
        # replayed over those layers would skip the hooks, loading nothing and saving
        # nothing.  So vLLM must keep attention outside its graphs (PIECEWISE), whatever
        # kv_connector_extra_config says.
        return True


def register_with_factory(factory) -> None:
    """Registers KVEngineConnector under its class name in vLLM's KVConnectorFactory.

    vLLM loads this connector by module path, which needs no registration -- except on
    one path: MultiConnector rebuilds each child's stats in the front-end process by the
    child's class name (KVConnectorFactory.get_connector_class_by_name), and an
    unregistered name fails there.  Importing this module registers it (below)."""
    try:
        factory.register_connector("KVEngineConnector", __name__, "KVEngineConnector")
    except ValueError:  # registered already (the module imported twice, or by vLLM)
        pass


if HAVE_VLLM:  # pragma: no cover - only inside a vLLM installation
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    register_with_factory(KVConnectorFactory)


def _regex_escape(text):
    """Escapes the ECMAScript regex metacharacters (the engine's DeleteByRegex syntax)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in text)
