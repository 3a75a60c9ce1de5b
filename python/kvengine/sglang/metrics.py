"""What get_stats() hands SGLang's storage metrics: SGLang's StorageMetrics (the four
lists its StorageMetricsCollector logs as histograms), with kvengine's own counts of the
interval added as fields of a subclass, so SGLang's isinstance check still holds."""

import threading
from dataclasses import dataclass

from ._sglang_compat import StorageMetrics

GIB = float(1 << 30)


@dataclass
class KVEngineStorageMetrics(StorageMetrics):
    """StorageMetrics plus the interval's page counts and bytes (all since the last
    get_stats()): pages looked up and found (batch_exists), found and left to recompute
    by the load planner, pages read and written, the
    ones that failed, pages not written because the store already had them."""

    lookup_pages: int = 0
    hit_pages: int = 0
    recompute_pages: int = 0  # found, but left to recompute by the load planner
    read_pages: int = 0
    read_bytes: int = 0
    failed_reads: int = 0
    written_pages: int = 0
    written_bytes: int = 0
    skipped_writes: int = 0
    failed_writes: int = 0


class StorageCounters:
    """The interval's numbers, added to by the prefetch and backup threads and drained
    by get_stats().  The histogram samples (pages and GiB/s per call) are kept only when
    SGLang's storage metrics are on, as SGLang's own backends do."""

    def __init__(self, keep_samples):
        self._keep_samples = keep_samples
        self._lock = threading.Lock()
        self._current = KVEngineStorageMetrics()

    def add(self, **counts):
        with self._lock:
            for name, value in counts.items():
                setattr(self._current, name, getattr(self._current, name) + value)

    def sample(self, direction, pages, nbytes, seconds):
        """One call's pages and bandwidth: direction "prefetch" (reads) or "backup"."""
        if not self._keep_samples or pages == 0:
            return
        with self._lock:
            getattr(self._current, direction + "_pgs").append(pages)
            getattr(self._current, direction + "_bandwidth").append(
                nbytes / GIB / max(seconds, 1e-9))

    def drain(self):
        with self._lock:
            current, self._current = self._current, KVEngineStorageMetrics()
        return current
