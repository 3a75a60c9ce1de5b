"""The load planner in the SGLang backend: how many of the pages batch_exists found to
report, so that SGLang fetches from the store only the pages that load no slower than it
computes them (kvengine.LoadPlanner; docs/sglang.md, "Never slower than recompute").

SGLang's batch_exists answers the count of leading pages the backend will serve: a
count shortened by the plan makes SGLang compute the rest.  The settings are the extra
config's "load_planner", "recompute_tokens_per_s" and "load_planner_options"
(kvengine/load_planning.py).  SGLang fetches pages into its host pool ahead of the
forward pass, not layer by layer, so overlap_layers stays 1 unless set.

The planner learns from the reads batch_get_v1 makes: the tier each planned page was
found in is remembered (a bounded table) until its read.  Pages it left to recompute
are remembered too (bounded): SGLang backs them up again once computed, and the backend
writes them although the store has them, bringing them back into memory without an SSD
read.

Thread-safety: SGLang calls batch_exists from its prefetch thread and batch_get_v1 from
its prefetch I/O thread; the tables have one lock, the planner its own.
"""

import collections
import logging
import threading

from .. import LOCATED_MEMORY, LOCATED_PEER, LOCATED_SSD, LoadPlanner

logger = logging.getLogger("kvengine.sglang")

NOT_SUPPORTED = -8
_REMEMBERED = 1 << 16  # pages whose tier (or cut) is remembered, at most


class PagePlanner:
    """One backend's planner: plans batch_exists answers, follows its reads."""

    def __init__(self, kwargs):
        self._planner = LoadPlanner(**kwargs)
        self._lock = threading.Lock()
        self._tiers = collections.OrderedDict()  # store key -> tier at the lookup
        self._cut = collections.OrderedDict()  # store key -> None: left to recompute

    def plan(self, store, lookup, page_bytes, page_tokens):
        """(the count of leading pages of `lookup` (store keys) to report, the count found
        after them and left to recompute); None when the store cannot say where its keys
        are (the caller asks it the usual way)."""
        results = store.batch_locate(lookup)
        if results and all(r == NOT_SUPPORTED for r in results):
            return None
        found = 0
        while found < len(results) and results[found] > 0:
            found += 1
        if found == 0:
            return 0, 0
        plan = self._planner.plan(results[:found], 1, page_bytes, page_tokens)
        n = plan["load_blocks"]
        with self._lock:
            for key, tier in zip(lookup[:n], results[:n]):
                _remember(self._tiers, key, tier)
            for key in lookup[n:found]:
                _remember(self._cut, key, None)
        if n < found:
            logger.debug("kvengine: %d of %d pages found left to recompute (estimated %.3f "
                         "ms to load, %.3f ms to compute)", found - n, found,
                         (plan["all_hits_load_s"] - plan["load_s"]) * 1000.0,
                         (plan["all_hits_recompute_s"] - plan["recompute_s"]) * 1000.0)
        return n, found - n

    def prefetching(self, started_pages, page_bytes):
        if started_pages:
            self._planner.add_in_flight(LOCATED_SSD, started_pages * page_bytes)

    def read(self, store_keys, ok, page_bytes, seconds):
        """batch_get_v1 read `store_keys` (ok: which succeeded) in `seconds`."""
        by_tier = {LOCATED_MEMORY: 0, LOCATED_SSD: 0, LOCATED_PEER: 0}
        with self._lock:
            for key, good in zip(store_keys, ok):
                tier = self._tiers.pop(key, None)
                if good and tier in by_tier:
                    by_tier[tier] += page_bytes
        if any(by_tier.values()) and seconds > 0:
            self._planner.record_load(by_tier[LOCATED_MEMORY], by_tier[LOCATED_SSD],
                                      by_tier[LOCATED_PEER], seconds)

    def rewrite(self, store_keys):
        """Of `store_keys` (a backup), those left to recompute: written even though the
        store has them."""
        with self._lock:
            return {k for k in store_keys if self._cut.pop(k, False) is None}


def _remember(table, key, value):
    table[key] = value
    table.move_to_end(key)
    while len(table) > _REMEMBERED:
        table.popitem(last=False)
