"""KVEngineConnector: vLLM's v1 KV connector over a kvengine store.

Load it in vLLM with (docs/vllm.md)

    kv_transfer_config={
        "kv_connector": "KVEngineConnector",
        "kv_connector_module_path": "kvengine.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"path": "/var/lib/kvcache",
                                      "options": {"memory_capacity_bytes": "64GiB"},
                                      "namespace": "team-a"},   # optional
    }

What it stores: one key per vLLM block, per attention layer, per tensor/pipeline rank.  The
value is that layer's bytes of that block, as they lie in the cache (layout.py); the keys
are spelled in common.py.

vLLM makes one connector per process and role, and the class splits as vLLM's own
connectors do: KVEngineConnector is the thin KVConnectorBase_V1 that vLLM loads, and hands
each call to its role's side, KVEngineScheduler (scheduler.py: lookups and each step's
metadata) or KVEngineWorker (worker.py: the layer-by-layer loads and saves).  What the
connector keeps itself is what both roles answer alike: the interval stats and metrics,
the store handle, and the class-level answers vLLM asks of the class.

One store per host: the scheduler-side and the worker-side connectors of a process (and
every connector naming the same path) share one handle (kvengine/shared_store.py), and the processes
of the host share the store: the first to open the path serves the others through
kvengine's attach, or all attach to a kv_server ("attach": socket); see docs/vllm.md.
"""

import threading
from typing import Any, Optional

from ._vllm_compat import (HAVE_VLLM, KVConnectorBase_V1, KVConnectorMetadata,
                           KVConnectorPromMetrics, KVConnectorRole, KVConnectorStats,
                           SupportsHMA, create_metric_per_engine)
from .common import BlockTransfer, KeyScheme, KVEngineConnectorMetadata, attr_of
from .account import LookupAccount, RequestAccounts
from .planner import SchedulerPlanner, planner_config
from .events import KVEngineKVEvents, events_enabled
from .scheduler import KVEngineScheduler
from ..shared_store import acquire_store, default_socket, namespace_config, release_store
from .worker import KVEngineWorker

__all__ = ["KVEngineConnector", "KVEngineConnectorMetadata", "KVEngineConnectorStats",
           "BlockTransfer", "HAVE_VLLM", "KVEngineScheduler", "KVEngineWorker",
           "default_socket"]


# ------------------------------------------------------------------ stats and metrics

_SUMMED = ("lookup_tokens", "hit_tokens", "loaded_blocks", "loaded_bytes", "load_errors",
           "saved_blocks", "saved_bytes", "skipped_saves", "failed_saves",
           "planned_recompute_tokens")
_LISTED = ("load_seconds", "save_seconds")
# Kept as they are, for the scheduler side's load planner (planner.py): one
# [memory bytes, ssd bytes, peer bytes, seconds] per load job, one [tokens, seconds] per
# timed forward step; not reduced.
_SAMPLES = ("load_samples", "step_samples")


class KVEngineConnectorStats(KVConnectorStats):
    """Counters of one interval (data is a plain dict, so it pickles across processes):
    sums in _SUMMED, one duration per step in _LISTED (seconds), and the load samples of
    _SAMPLES."""

    def __init__(self, data: Optional[dict] = None):
        super().__init__(data=dict(data) if data else {})
        for k in _SUMMED:
            self.data.setdefault(k, 0)
        for k in _LISTED + _SAMPLES:
            self.data[k] = list(self.data.get(k, []))

    def reset(self):
        self.data = {}
        self.__init__()

    def add(self, **values):
        for k, v in values.items():
            if k in _LISTED or k in _SAMPLES:
                self.data[k].append(v)
            else:
                self.data[k] += v

    def aggregate(self, other: "KVEngineConnectorStats") -> "KVEngineConnectorStats":
        for k in _SUMMED:
            self.data[k] += other.data.get(k, 0)
        for k in _LISTED + _SAMPLES:
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
                                                                  for k in _LISTED + _SAMPLES)


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


class _IntervalStats:
    """The stats of the interval since the last take(), added to by vLLM's thread and by
    the worker's load and save threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stats = KVEngineConnectorStats()

    def record(self, **values):
        with self._lock:
            self._stats.add(**values)

    def take(self) -> Optional[KVEngineConnectorStats]:
        """The interval's stats, None when nothing happened; a new interval starts."""
        with self._lock:
            if self._stats.is_empty():
                return None
            stats, self._stats = self._stats, KVEngineConnectorStats()
        return stats


# ------------------------------------------------------------------ the connector


class KVEngineConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM v1 KV connector backed by kvengine (see the module docstring).

    A scheduler-role connector holds a KVEngineScheduler (connector_scheduler), a
    worker-role one a KVEngineWorker (connector_worker).  A call that belongs to the
    other role finds nothing to do and answers as that side would with no requests and
    no caches: vLLM makes no such call, but a connector never asserts its role."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM before kv_cache_config joined the constructor
            super().__init__(vllm_config, role)
            self._kv_cache_config = kv_cache_config
        kv_config = self._kv_transfer_config
        extra = dict(attr_of(kv_config, "kv_connector_extra_config", None) or {})
        keys = KeyScheme(vllm_config, kv_config, extra, role, self._kv_cache_config)
        path, attach = extra.get("path"), extra.get("attach")
        if not path and not attach:
            raise ValueError("KVEngineConnector needs kv_connector_extra_config['path'] "
                             "(or ['attach'], the socket of a kv_server)")
        namespace, namespace_options = namespace_config(extra, "kv_connector_extra_config")
        self._store_name = attach or path
        # With "namespace", every key of this instance lives in that namespace of the store
        # (created when missing): docs/vllm.md, "Tenants and namespaces".
        self._db = acquire_store(path, attach, dict(extra.get("options", {})), namespace,
                                 namespace_options)
        self._closed = False
        self._stats = _IntervalStats()
        # KV events (events.py): on when vLLM publishes them.  The scheduler side keeps
        # the workers' events of the step until take_events.
        self._events_on = events_enabled(vllm_config, extra)
        self._kv_cache_events: Optional[KVEngineKVEvents] = None
        self.connector_scheduler: Optional[KVEngineScheduler] = None
        self.connector_worker: Optional[KVEngineWorker] = None
        account_path, account_rate = _account_options(extra)
        if role == KVConnectorRole.SCHEDULER:
            lookup = LookupAccount(account_rate, self._db, keys) if account_path else None
            # The load planner (planner.py): bad options raise ValueError naming them.
            planner_kwargs = planner_config(extra)
            planner = (SchedulerPlanner(planner_kwargs, self._db, keys)
                       if planner_kwargs is not None else None)
            self.connector_scheduler = KVEngineScheduler(kv_config, keys, self._db,
                                                         self._stats.record, self._events_on,
                                                         lookup, planner,
                                                         kv_cache_config=self._kv_cache_config)
        elif role == KVConnectorRole.WORKER:
            # One rank writes the lines: the first of the instance.
            writer = account_path and (keys.tp_rank, keys.pp_rank) == (0, 0)
            accounts = RequestAccounts(account_path, True) if writer else None
            self.connector_worker = KVEngineWorker(self._kv_cache_config, extra, keys,
                                                   self._db, self._stats.record,
                                                   self._events_on, accounts)

    def block_key(self, block_hash, layer=0, tp_rank=None, pp_rank=None, tenant=None):
        """The store key of one block of one layer on one rank (default: this worker's)
        for a tenant (common.tenant_of of its request; None: no cache_salt, no LoRA); None
        while that rank's layout is unknown."""
        side = self.connector_worker or self.connector_scheduler
        return side.block_key(block_hash, layer, tp_rank, pp_rank, tenant)

    # The worker's counters since start (0 on the scheduler side).
    @property
    def num_loaded_blocks(self) -> int:
        return self.connector_worker.num_loaded_blocks if self.connector_worker else 0

    @property
    def num_saved_blocks(self) -> int:
        return self.connector_worker.num_saved_blocks if self.connector_worker else 0

    @property
    def num_skipped_saves(self) -> int:
        return self.connector_worker.num_skipped_saves if self.connector_worker else 0

    # ============================================================== scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
        if self.connector_scheduler is None:
            return 0, False
        return self.connector_scheduler.get_num_new_matched_tokens(request,
                                                                   num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if self.connector_scheduler is not None:
            self.connector_scheduler.update_state_after_alloc(request, blocks,
                                                              num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        if self.connector_scheduler is None:
            return KVEngineConnectorMetadata()
        return self.connector_scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list) -> tuple:
        if self.connector_scheduler is None:
            return False, None
        return self.connector_scheduler.request_finished(request)

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
        if self.connector_scheduler is None:
            return None  # vLLM's answer for a connector that does not reset
        return self.connector_scheduler.reset_cache()

    def update_connector_output(self, connector_output: Any):
        """Hands the workers' measured loads to the load planner, and keeps their KV
        events of the step (vLLM's KVOutputAggregator has concatenated them and counted
        the workers) until take_events."""
        if self.connector_scheduler is not None:
            self.connector_scheduler.update_connector_output(connector_output)
        events = getattr(connector_output, "kv_cache_events", None)
        if not events or not isinstance(events, KVEngineKVEvents):
            return
        if self._kv_cache_events is None:
            self._kv_cache_events = events
        else:
            self._kv_cache_events.add_events(events.get_all_events())
            self._kv_cache_events.increment_workers(events.get_number_of_workers())

    def take_events(self):
        """The KV events every worker reported since the last call (vLLM publishes
        them)."""
        if self._kv_cache_events is not None:
            events, self._kv_cache_events = self._kv_cache_events, None
            yield from events.aggregate().get_all_events()
        resync = getattr(self.connector_scheduler, "resync", None)
        if resync is not None:
            yield from resync.take()

    def request_resync(self):
        """Replays the store's blocks of this instance as BlockStored events at the next
        publication, for a router that restarted (scheduler side, KV events on); the
        store's restarts (a new boot epoch) replay by themselves."""
        resync = getattr(self.connector_scheduler, "resync", None)
        if resync is not None:
            resync.request()

    # ============================================================== both sides
    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        return self._stats.take()

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None) -> Optional[KVConnectorStats]:
        return KVEngineConnectorStats(data=data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                           per_engine_labelvalues: dict):
        return KVEnginePromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)

    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
        release_store(self._store_name, self._db)

    # ============================================================== worker side
    def _bound_metadata(self) -> Optional[KVEngineConnectorMetadata]:
        return self._get_connector_metadata() if self.has_connector_metadata() else None

    def register_kv_caches(self, kv_caches: dict) -> None:
        if self.connector_worker is not None:
            self.connector_worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self.connector_worker is not None:
            self.connector_worker.start_load_kv(self._bound_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.connector_worker is not None:
            self.connector_worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        if self.connector_worker is not None:
            self.connector_worker.save_kv_layer(layer_name, self._bound_metadata())

    def wait_for_save(self):
        if self.connector_worker is not None:
            self.connector_worker.wait_for_save(self._bound_metadata())

    def get_finished(self, finished_req_ids: set) -> tuple:
        if self.connector_worker is not None:
            self.connector_worker.finish_requests(finished_req_ids)
        return None, None

    def get_kv_connector_kv_cache_events(self) -> Optional[KVEngineKVEvents]:
        """This rank's KV events of the step: an object every step while events are on,
        empty when there are none, so that vLLM counts this rank (events.py)."""
        if self.connector_worker is None or not self._events_on:
            return None
        events = KVEngineKVEvents(num_workers=1)
        events.add_events(self.connector_worker.take_kv_events(self._bound_metadata()))
        return events

    def get_block_ids_with_load_errors(self) -> set:
        if self.connector_worker is None:
            return set()
        return self.connector_worker.get_block_ids_with_load_errors()

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


def _account_options(extra):
    """(path, sampling rate) of the request account from kv_connector_extra_config; the
    path is None when the account is off (the default)."""
    path = extra.get("request_account") or None
    try:
        rate = float(extra.get("request_account_sample", 1.0))
    except (TypeError, ValueError):
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ValueError("kv_connector_extra_config['request_account_sample'] must be a "
                         "number from 0 to 1, not %r" % (extra.get("request_account_sample"),))
    return path, rate


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
