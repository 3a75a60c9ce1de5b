"""vLLM's v1 KV-connector base types, or a faithful stand-in when vLLM is absent.

Inside vLLM this module re-exports vLLM's own classes
(vllm/distributed/kv_transfer/kv_connector/v1/base.py), so KVEngineConnector is a real
subclass of vLLM's KVConnectorBase_V1.  Without vLLM (tests, this repository's CI) it
defines stand-ins with the same names, the same method signatures and the same default
behaviour, so the connector is written and tested against one interface.

The stand-in follows vLLM's base class as of 2025 (kv_cache_config in the constructor,
get_block_ids_with_load_errors, request_finished returning (bool, params)).  Only the
parts a connector implements or calls are reproduced; what vLLM adds around them (the
factory, the forward context, the scheduler) is vLLM's business.
"""

import enum
from abc import ABC, abstractmethod
from typing import Any, Optional

try:  # pragma: no cover - exercised only inside a vLLM installation
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        # Connector running in the scheduler process
        SCHEDULER = 0
        # Connector running in the worker process
        WORKER = 1

    class KVConnectorMetadata(ABC):  # noqa: B024 -- as in vLLM: a marker base
        """Metadata sent from the scheduler-side connector to the worker-side connectors."""

    class KVConnectorBase_V1(ABC):  # noqa: N801 -- vLLM's name
        """Stand-in of vLLM's KVConnectorBase_V1 (same signatures and defaults)."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any = None):
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            if getattr(vllm_config, "kv_transfer_config", None) is not None:
                self._kv_transfer_config = vllm_config.kv_transfer_config
            else:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_cache_config = kv_cache_config
            self._role = role

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

        def register_kv_caches(self, kv_caches: dict) -> None:
            return

        def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
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
        def wait_for_save(self) -> None:
            pass

        def get_finished(self, finished_req_ids: set) -> tuple:
            return None, None

        def get_block_ids_with_load_errors(self) -> set:
            return set()

        def shutdown(self) -> None:
            return None

        def get_kv_connector_stats(self) -> Any:
            return None

        # ---------------------------------------------------------------- scheduler side
        @abstractmethod
        def get_num_new_matched_tokens(self, request: Any,
                                       num_computed_tokens: int) -> tuple:
            pass

        @abstractmethod
        def update_state_after_alloc(self, request: Any, blocks: Any,
                                     num_external_tokens: int) -> None:
            pass

        @abstractmethod
        def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
            pass

        def update_connector_output(self, connector_output: Any) -> None:
            return

        def request_finished(self, request: Any, block_ids: list) -> tuple:
            return False, None

        def take_events(self):
            return ()

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
            if cls is KVConnectorBase_V1:
                raise TypeError("get_required_kvcache_layout should not be called "
                                "on the abstract base class")
            return None


__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole"]
