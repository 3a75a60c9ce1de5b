"""SGLang's HiCache storage interface, or a faithful stand-in when SGLang is absent.

Inside SGLang this module re-exports SGLang's own classes
(python/sglang/srt/mem_cache/hicache_storage.py and the StorageMetrics of
python/sglang/srt/observability/metrics_collector.py), so KVEngineHiCacheStorage is a
real subclass of SGLang's HiCacheStorage: StorageBackendFactory checks that with
issubclass, and the metrics collector asserts isinstance(..., StorageMetrics).  Without
SGLang (tests, this repository's CI) it defines stand-ins with the same names, members,
signatures and defaults as SGLang main (test/python/sglang_conformance.py checks them;
docs/sglang.md records the commit).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, List, Optional

try:  # pragma: no cover - exercised only inside an SGLang installation
    from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )
    from sglang.srt.observability.metrics_collector import StorageMetrics  # noqa: F401

    HAVE_SGLANG = True
except ImportError:
    HAVE_SGLANG = False

    # -------------------------------------- sglang/srt/mem_cache/hicache_storage.py

    @dataclass
    class HiCacheStorageConfig:
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(ABC):
        """The L3 storage interface SGLang's HiCacheController drives (its docstrings,
        shortened): one bool per key from the v1 calls, the count of leading keys
        present from batch_exists."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys: List[str], pool_transfers=None,
                            extra_info: Optional[HiCacheStorageExtraInfo] = None):
            """Longest prefix present in every pool (hybrid models)."""
            raise NotImplementedError()

        def batch_get_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None):
            """Storage -> host pools, per PoolTransfer; {pool name: [bool]}."""
            raise NotImplementedError()

        def batch_set_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None):
            """Host pools -> storage, per PoolTransfer; {pool name: [bool]}."""
            raise NotImplementedError()

        def batch_get_v1(self, keys: List[str], host_indices,
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
            """Retrieve values for multiple keys; one bool per key."""
            pass

        def batch_set_v1(self, keys: List[str], host_indices,
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
            """Store multiple key-value pairs; one bool per key."""
            pass

        @abstractmethod
        def get(self, key: str, target_location: Optional[Any] = None,
                target_sizes: Optional[Any] = None):
            """The value of key; None if it does not exist."""
            pass

        @abstractmethod
        def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                      target_sizes: Optional[Any] = None):
            """A tensor or None per key."""
            pass

        @abstractmethod
        def set(self, key: str, value: Optional[Any] = None,
                target_location: Optional[Any] = None,
                target_sizes: Optional[Any] = None) -> bool:
            """True if the value was stored."""
            pass

        @abstractmethod
        def batch_set(self, keys: List[str], values: Optional[Any] = None,
                      target_locations: Optional[Any] = None,
                      target_sizes: Optional[Any] = None) -> bool:
            """True if every value was stored."""
            pass

        @abstractmethod
        def exists(self, key: str) -> bool:
            pass

        def batch_exists(self, keys: List[str],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
            """The number of consecutive existing keys from the start."""
            for i in range(len(keys)):
                if not self.exists(keys[i]):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None

    # ---------------------------- sglang/srt/observability/metrics_collector.py

    @dataclass
    class StorageMetrics:
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)
