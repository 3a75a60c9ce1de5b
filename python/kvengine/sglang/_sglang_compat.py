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

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

try:  # pragma: no cover - exercised only inside an SGLang installation
    from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
        PrefetchTimeoutConfig,
        SidecarPoolSpec,
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

    @dataclass(frozen=True)
    class PrefetchTimeoutConfig:
        """Knobs for the linear prefetch-timeout policy used by HiCache."""

        base: float = 2.0
        per_ki_token: float = 0.1
        max: float = 30.0

    class PoolName(str, Enum):
        """Well-known pool names used as PoolTransfer/PoolEntry identifiers."""

        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, Enum):
        """Hit policy for batch_exists_v2 per-pool prefix matching.

        ALL_PAGES      : every page in [0, kv_hit) must exist (e.g. DSA).
        TRAILING_PAGES : only the last N pages must exist (e.g. Mamba/SWA states).
        """

        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclass
    class PoolTransfer:
        """Unified per-pool transfer descriptor for batch v2 interface: host_indices +
        keys on the host<->storage path."""

        name: PoolName
        host_indices: Optional[Any] = None
        device_indices: Optional[Any] = None
        keys: Optional[List[str]] = None
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Optional[PoolName] = None

    @dataclass(frozen=True)
    class SidecarPoolSpec:
        """Pool whose transfer indices are reused from one real source pool."""

        pool_name: PoolName
        indices_from_pool: PoolName
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES

    @dataclass
    class PoolTransferResult:
        """Tracks how many pages were successfully processed per pool."""

        kv_hit_pages: int
        extra_pool_hit_pages: dict[str, int]

        @classmethod
        def empty(cls) -> PoolTransferResult:
            return cls(0, {})

        def update_kv_hit_pages(self, kv_hit_pages: int) -> None:
            """Accumulate kv_hit_pages across batches (max = last successful batch)."""
            self.kv_hit_pages = max(self.kv_hit_pages, kv_hit_pages)

        def update_extra_pool_hit_pages(self, results: dict[str, List[bool]]) -> None:
            """Record the leading run of successes per extra pool."""
            self.extra_pool_hit_pages.update(
                {name: (rs.index(False) if False in rs else len(rs))
                 for name, rs in results.items()})

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

        def batch_exists_v2(self, keys: List[str],
                            pool_transfers: Optional[List[PoolTransfer]] = None,
                            extra_info: Optional[HiCacheStorageExtraInfo] = None
                            ) -> PoolTransferResult:
            """Longest prefix usable in every pool: kv_hit_pages, and the pages found per
            pool (all_pages: every page of [0, kv_hit); trailing_pages: the last
            len(transfer.keys) pages of the prefix)."""
            raise NotImplementedError()

        def batch_get_v2(self, transfers: List[PoolTransfer],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None
                         ) -> dict[str, List[bool]]:
            """Storage -> host pools, per PoolTransfer; {pool name: [bool]}."""
            raise NotImplementedError()

        def batch_set_v2(self, transfers: List[PoolTransfer],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None
                         ) -> dict[str, List[bool]]:
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
