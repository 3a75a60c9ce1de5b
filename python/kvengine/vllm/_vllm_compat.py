"""vLLM's v1 KV-connector base types, or a faithful stand-in when vLLM is absent.

Inside vLLM this module re-exports vLLM's own classes
(vllm/distributed/kv_transfer/kv_connector/v1/base.py and .../v1/metrics.py), so
KVEngineConnector is a real subclass of vLLM's KVConnectorBase_V1 and SupportsHMA.
Without vLLM (tests, this repository's CI) it defines stand-ins with the same names, the
same members, the same signatures and the same defaults as vLLM main (mid 2026), so the
connector is written and tested against one interface.  What vLLM adds around them (the
factory, the forward context, the scheduler) is vLLM's business; test/python/vllm_fakes.py
models the parts the tests drive.
"""

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

try:  # pragma: no cover - exercised only inside a vLLM installation
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1,
        KVConnectorHandshakeMetadata,
        KVConnectorMetadata,
        KVConnectorRole,
        KVConnectorWorkerMetadata,
        SupportsHMA,
        supports_hma,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: F401
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
    from vllm.v1.metrics.utils import create_metric_per_engine  # noqa: F401

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
        def prefer_cross_layer_blocks(self) -> bool:
            return False

        @property
        def supports_eagle_prefix_cache_hashing(self) -> bool:
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
            self._role = role
            self.use_eagle_prefix_cache_hashing = False

        def set_eagle_prefix_cache_hashing(self, enabled: bool) -> None:
            self.use_eagle_prefix_cache_hashing = enabled

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        # ---------------------------------------------------------------- worker side
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

        def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any):
            return

        def set_host_xfer_buffer_ops(self, copy_operation: Any):
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

        def request_finished(self, request: Any, block_ids: list) -> tuple:
            return False, None

        def take_events(self):
            return ()

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


__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorHandshakeMetadata",
           "KVConnectorMetadata", "KVConnectorPromMetrics", "KVConnectorRole",
           "KVConnectorStats", "KVConnectorWorkerMetadata", "SupportsHMA",
           "create_metric_per_engine", "supports_hma"]
