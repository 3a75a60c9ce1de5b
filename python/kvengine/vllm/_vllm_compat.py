"""vLLM's v1 KV-connector base types, or a faithful stand-in when vLLM is absent.

Inside vLLM this module re-exports vLLM's own classes
(vllm/distributed/kv_transfer/kv_connector/v1/base.py and .../v1/metrics.py), so
KVEngineConnector is a real subclass of vLLM's KVConnectorBase_V1 and SupportsHMA.
Without vLLM (tests, this repository's CI) it defines stand-ins with the same names, the
same members, the same signatures and the same defaults as vLLM main, so the connector is
written and tested against one interface.  Last checked (2026-12-07, by
scripts/check_vllm_conformance.py, 0 problems) against base.py, multi_connector.py and
v1/outputs.py of vllm-project/vllm@00f4240ee6458263d76cf51ca7901ce1350bb4d1 (its date
is not recorded where it was read; it has vLLM PR #53333, 2026-08) -- docs/vllm.md,
"Conformance with vLLM main", lists the whole tree.  What vLLM adds around them (the
factory, the forward context, the scheduler) is vLLM's business; test/python/vllm_fakes.py
models the parts the tests drive.
"""

import collections
import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

# ------------------------------------------------------------ msgspec's shapes
# (the Struct stand-in's methods, and to_builtins at the end of the file)


def _struct_init(self, *args, **kwargs):
    fields = type(self).__struct_fields__
    if len(args) > len(fields):
        raise TypeError("%s takes at most %d positional arguments"
                        % (type(self).__name__, len(fields)))
    values = dict(zip(fields, args))
    for name, value in kwargs.items():
        if name not in fields:
            raise TypeError("Unexpected keyword argument '%s'" % name)
        if name in values:
            raise TypeError("Argument '%s' given by name and position" % name)
        values[name] = value
    for name in fields:
        if name not in values:
            if name not in type(self).__struct_defaults__:
                raise TypeError("Missing required argument '%s'" % name)
            values[name] = type(self).__struct_defaults__[name]
        object.__setattr__(self, name, values[name])


def _struct_eq(self, other):
    if type(self) is not type(other):
        return NotImplemented
    return all(getattr(self, f) == getattr(other, f) for f in type(self).__struct_fields__)


def _struct_repr(self):
    return "%s(%s)" % (type(self).__name__, ", ".join(
        "%s=%r" % (f, getattr(self, f)) for f in type(self).__struct_fields__))


try:  # pragma: no cover - exercised only inside a vLLM installation
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1,
        KVConnectorHandshakeMetadata,
        KVConnectorMetadata,
        KVConnectorRole,
        KVConnectorTransferResults,
        KVConnectorWorkerMetadata,
        SupportsHMA,
        supports_hma,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: F401
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
    from vllm.v1.metrics.utils import create_metric_per_engine  # noqa: F401
    from vllm.distributed.kv_events import (  # noqa: F401
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        EventBatch,
        KVCacheEvent,
        KVConnectorKVEvents,
        KVEventAggregator,
        KVEventBatch,
    )

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    try:  # what vLLM's metric_types are keyed by (vllm/v1/metrics/loggers.py)
        from prometheus_client import Counter, Gauge, Histogram
    except ImportError:  # no Prometheus client: classes that only name the three kinds
        class Gauge:  # noqa: D101
            pass

        class Counter:  # noqa: D101
            pass

        class Histogram:  # noqa: D101
            pass

    # ------------------------------------------- vllm/distributed/kv_events.py
    # The KV cache events vLLM publishes (its ZMQ publisher encodes each KVEventBatch
    # with msgspec's msgpack encoder), its aggregator of the workers' events, and the
    # container connectors hand it.  Without msgspec, Struct stands in for
    # msgspec.Struct: keyword options, fields from the annotations in order, defaults,
    # equality by type and fields; to_builtins (below) gives the encoder's shape.

    try:
        from msgspec import Struct
    except ImportError:
        class Struct:
            """msgspec.Struct's behaviour that the events rely on (see above)."""

            def __init_subclass__(cls, **config):
                cls.__struct_config__ = dict(getattr(cls, "__struct_config__", {}), **config)
                fields, defaults = [], {}
                for klass in reversed(cls.__mro__):
                    for name in getattr(klass, "__annotations__", {}):
                        if name.startswith("__"):
                            continue
                        if name not in fields:
                            fields.append(name)
                        if name in klass.__dict__:
                            defaults[name] = klass.__dict__[name]
                cls.__struct_fields__ = tuple(fields)
                cls.__struct_defaults__ = defaults
                cls.__init__ = _struct_init
                cls.__eq__ = _struct_eq
                cls.__repr__ = _struct_repr
                if "__hash__" not in cls.__dict__:
                    cls.__hash__ = None  # as msgspec: a mutable struct is unhashable

    class KVCacheEvent(Struct, omit_defaults=True, gc=False, tag=True):
        """Base class for all KV cache-related events"""

    class EventBatch(Struct, omit_defaults=True, gc=False):
        ts: float
        events: list
        data_parallel_rank: Optional[int] = None

    class BlockStored(KVCacheEvent):
        block_hashes: list
        parent_block_hash: Any
        token_ids: list
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

        def __hash__(self) -> int:
            return hash((tuple(self.block_hashes), self.parent_block_hash,
                         tuple(self.token_ids), self.block_size, self.lora_id, self.medium,
                         tuple(self.extra_keys) if self.extra_keys else None,
                         self.group_idx, self.kv_cache_spec_kind,
                         self.kv_cache_spec_sliding_window))

    class BlockRemoved(KVCacheEvent):
        block_hashes: list
        medium: Optional[str]
        group_idx: Optional[int] = None

        def __hash__(self) -> int:
            return hash((tuple(self.block_hashes), self.medium, self.group_idx))

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list

    class KVEventAggregator:
        """Counts each event over the workers' batches; the common events are those
        every worker reported."""

        __slots__ = ("_event_counter", "_num_workers")

        def __init__(self, num_workers: int) -> None:
            if num_workers <= 0:
                raise ValueError("num_workers must be greater than zero.")
            self._event_counter = collections.Counter()
            self._num_workers = num_workers

        def add_events(self, events: list) -> None:
            if not isinstance(events, list):
                raise TypeError("events must be a list of KVCacheEvent.")
            self._event_counter.update(events)

        def get_common_events(self) -> list:
            return [event for event, count in self._event_counter.items()
                    if count == self._num_workers]

        def get_all_events(self) -> list:
            return list(self._event_counter.elements())

        def clear_events(self) -> None:
            self._event_counter.clear()

        def increment_workers(self, count: int = 1) -> None:
            if count <= 0:
                raise ValueError("count must be positive.")
            self._num_workers += count

        def reset_workers(self) -> None:
            self._num_workers = 1

        def get_number_of_workers(self) -> int:
            return self._num_workers

        def __repr__(self) -> str:
            return "<KVEventAggregator workers=%d, events=%d>" % (self._num_workers,
                                                                  len(self._event_counter))

    class KVConnectorKVEvents(ABC):
        """What a connector's workers hand vLLM each step (KVConnectorOutput's
        kv_cache_events); KVOutputAggregator merges the ranks' objects, the scheduler-side
        connector aggregates them in take_events."""

        @abstractmethod
        def add_events(self, events: list) -> None:
            raise NotImplementedError

        @abstractmethod
        def aggregate(self) -> "KVConnectorKVEvents":
            raise NotImplementedError

        @abstractmethod
        def increment_workers(self, count: int = 1) -> None:
            raise NotImplementedError

        @abstractmethod
        def get_all_events(self) -> list:
            raise NotImplementedError

        @abstractmethod
        def get_number_of_workers(self) -> int:
            raise NotImplementedError

        @abstractmethod
        def clear_events(self) -> None:
            raise NotImplementedError

        def merge(self, other: "KVConnectorKVEvents") -> "KVConnectorKVEvents":
            self.add_events(other.get_all_events())
            return self

    # -------------------------------------------------- vllm/v1/metrics/utils.py

    def create_metric_per_engine(metric: Any, per_engine_labelvalues: dict) -> dict:
        """One labelled child of metric per engine index (vLLM's helper since it dropped
        KVConnectorPromMetrics.make_per_engine, vLLM PR #33898)."""
        return {idx: metric.labels(*labelvalues)
                for idx, labelvalues in per_engine_labelvalues.items()}

    class SupportsHMA(ABC):
        """Marks a connector that supports the hybrid memory allocator (several KV-cache
        groups); vLLM then calls request_finished_all_groups instead of request_finished."""

        @abstractmethod
        def request_finished_all_groups(self, request: Any, block_ids: tuple) -> tuple:
            raise NotImplementedError

    def supports_hma(connector: Any) -> bool:
        if isinstance(connector, type):
            return issubclass(connector, SupportsHMA)
        return isinstance(connector, SupportsHMA)

    class KVConnectorRole(enum.Enum):
        # Connector running in the scheduler process
        SCHEDULER = 0
        # Connector running in the worker process
        WORKER = 1

    class KVConnectorHandshakeMetadata(ABC):  # noqa: B024 -- as in vLLM: a marker base
        """Out-of-band handshake metadata between P/D workers (picklable)."""

    class KVConnectorMetadata(ABC):  # noqa: B024 -- as in vLLM: a marker base
        """Metadata sent from the scheduler-side connector to the worker-side connectors."""

    class KVConnectorWorkerMetadata(ABC):
        """Metadata sent back from the workers to the scheduler-side connector."""

        @abstractmethod
        def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
            pass

    @dataclass
    class KVConnectorTransferResults:
        """One worker's snapshot of finished async sends and receives (get_transfer_results);
        a failed receive is also in finished_recving, so the scheduler releases it."""

        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)
        failed_recving: set = field(default_factory=set)
        # request id -> (transfer id, exclusive token boundary, prompt digest)
        prefix_replay_checkpoints: dict = field(default_factory=dict)

    # ------------------------------------------------------------ metrics (v1/metrics.py)

    @dataclass
    class KVConnectorStats:
        """Per-interval connector telemetry; subclasses implement the four methods.
        Workers ship .data to the logger process, which rebuilds the object with the
        connector's build_kv_connector_stats, aggregates across ranks and reduces."""

        data: dict = field(default_factory=dict)

        def to_dict(self) -> dict:
            # What crosses from the worker to the logger process: the data itself.
            return self.data

        def reset(self):
            raise NotImplementedError

        def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
            raise NotImplementedError

        def reduce(self) -> dict:
            raise NotImplementedError

        def is_empty(self) -> bool:
            raise NotImplementedError

    class KVConnectorPromMetrics:
        """Per-connector Prometheus metrics: the subclass creates its metrics with the
        classes of metric_types, one child per engine through create_metric_per_engine,
        and records stats data in observe()."""

        def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list,
                     per_engine_labelvalues: dict):
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._gauge_cls = metric_types[Gauge]
            self._counter_cls = metric_types[Counter]
            self._histogram_cls = metric_types[Histogram]
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

        def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
            raise NotImplementedError

    # ------------------------------------------------------------ the base class

    class KVConnectorBase_V1(ABC):  # noqa: N801 -- vLLM's name
        """Stand-in of vLLM's KVConnectorBase_V1: every member, vLLM's defaults."""

        @property
        def supports_divergent_local_hybrid_hits(self) -> bool:
            return False

        @property
        def requires_kv_delivery(self) -> bool:
            # vLLM: a producer's hand-off must be delivered (a preempted request with a
            # pending hand-off is recomputed); best-effort caches override with False.
            return self._kv_transfer_config.is_kv_producer

        def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            if vllm_config.kv_transfer_config is not None:
                self._kv_transfer_config = vllm_config.kv_transfer_config
            else:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_cache_config = kv_cache_config
            self._kv_cache_manager = None
            self._role = role

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        # ---------------------------------------------------------------- worker side
        def get_mem_pool_context(self) -> Any:
            return None

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches: dict):
            return

        def set_host_xfer_buffer_ops(self, copy_operation: Any):
            return

        def finish_forward(self) -> None:
            return

        def reset_capture_state(self) -> None:
            return

        def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
            return

        @abstractmethod
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            pass

        @abstractmethod
        def wait_for_layer_load(self, layer_name: str) -> None:
            pass

        @abstractmethod
        def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                          **kwargs: Any) -> None:
            pass

        @abstractmethod
        def wait_for_save(self):
            pass

        def get_finished(self, finished_req_ids: set) -> tuple:
            return None, None

        def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
            # What vLLM's model runner collects each step: by default get_finished's two
            # sets, no failed receive.
            finished_sending, finished_recving = self.get_finished(finished_req_ids)
            return KVConnectorTransferResults(
                finished_sending=set(finished_sending or ()),
                finished_recving=set(finished_recving or ()))

        def get_block_ids_with_load_errors(self) -> set:
            return set()

        def shutdown(self):
            return None

        def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
            return None

        def get_kv_connector_kv_cache_events(self) -> Any:
            return None

        def get_handshake_metadata(self) -> Optional[KVConnectorHandshakeMetadata]:
            return None

        def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
            return None

        # ---------------------------------------------------------------- scheduler side
        def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
            self._kv_cache_manager = kv_cache_manager
            self.bind_gpu_block_pool(kv_cache_manager.block_pool)

        def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
            return

        @abstractmethod
        def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
            pass

        @abstractmethod
        def update_state_after_alloc(self, request: Any, blocks: Any,
                                     num_external_tokens: int):
            pass

        @abstractmethod
        def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
            pass

        def on_new_request(self, request: Any) -> None:
            return

        def update_connector_output(self, connector_output: Any):
            return

        def can_load_prefix_replay_checkpoint(self, request: Any, num_local_tokens: int,
                                              num_external_tokens: int) -> bool:
            return False

        def consume_prefix_replay_checkpoint(self, request: Any, num_hit_tokens: int) -> bool:
            return False

        def request_finished(self, request: Any, block_ids: list) -> tuple:
            return False, None

        def register_finished_partial_tail(self, request: Any, block_ids: tuple,
                                           partial_tail_offloads: list) -> bool:
            return False

        def take_events(self):
            return ()

        def has_pending_block_frees(self) -> bool:
            return False

        def has_pending_push_work(self) -> bool:
            return False

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
            if cls is KVConnectorBase_V1:
                raise TypeError("get_required_kvcache_layout should not be called "
                                "on the abstract base class")
            return None

        @classmethod
        def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
            return False

        def get_finished_count(self) -> Optional[int]:
            return None

        @classmethod
        def build_kv_connector_stats(cls, data: Optional[dict] = None
                                     ) -> Optional[KVConnectorStats]:
            return None

        def set_xfer_handshake_metadata(self, metadata: dict) -> None:
            return None

        def set_xfer_handshake_metadata_pp_aware(self, metadata: dict) -> None:
            if any(pp_rank != 0 for pp_rank, _ in metadata):
                raise ValueError(
                    "%s received pp_rank > 0 handshake metadata but does not support "
                    "PP-disaggregated KV transfer." % type(self).__name__)
            self.set_xfer_handshake_metadata(
                {tp_rank: meta for (_, tp_rank), meta in metadata.items()})

        @classmethod
        def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                               per_engine_labelvalues: dict) -> Optional[KVConnectorPromMetrics]:
            return None

        def reset_cache(self) -> Optional[bool]:
            return None


def to_builtins(obj):
    """What msgspec's encoders make of obj before the bytes (msgspec.to_builtins): a
    struct becomes a map of its fields in order -- an array where the class says
    array_like -- a tagged one led by its "type" (the class name), with fields equal to
    their defaults left out where it says omit_defaults.  bytes stay bytes (msgpack's bin
    type).  With msgspec installed (inside vLLM), msgspec's own."""
    try:
        import msgspec
    except ImportError:
        msgspec = None
    if msgspec is not None and isinstance(obj, msgspec.Struct):  # pragma: no cover
        return msgspec.to_builtins(obj, enc_hook=None, builtin_types=(bytes,))
    config = getattr(type(obj), "__struct_config__", None)
    if config is not None and hasattr(type(obj), "__struct_fields__"):
        cls = type(obj)
        names = [f for f in cls.__struct_fields__
                 if not (config.get("omit_defaults") and f in cls.__struct_defaults__
                         and getattr(obj, f) == cls.__struct_defaults__[f])]
        values = [to_builtins(getattr(obj, f)) for f in names]
        tag = cls.__name__ if config.get("tag") is True else config.get("tag")
        if config.get("array_like"):
            return ([tag] if tag else []) + values
        out = {"type": tag} if tag else {}
        out.update(zip(names, values))
        return out
    if isinstance(obj, (list, tuple)):
        return [to_builtins(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_builtins(v) for k, v in obj.items()}
    return obj


__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorHandshakeMetadata",
           "KVConnectorMetadata", "KVConnectorPromMetrics", "KVConnectorRole",
           "KVConnectorStats", "KVConnectorTransferResults", "KVConnectorWorkerMetadata", "SupportsHMA",
           "create_metric_per_engine", "supports_hma", "AllBlocksCleared", "BlockRemoved",
           "BlockStored", "EventBatch", "KVCacheEvent", "KVConnectorKVEvents",
           "KVEventAggregator", "KVEventBatch", "to_builtins"]
