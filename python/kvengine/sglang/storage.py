"""KVEngineHiCacheStorage: kvengine as SGLang's HiCache L3 storage backend.

SGLang loads it with (docs/sglang.md):

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "kvengine", "module_path": "kvengine.sglang",
      "class_name": "KVEngineHiCacheStorage", "interface_v1": 1,
      "path": "/var/lib/kvcache", "options": {"memory_capacity_bytes": "64GiB"}}'

One value per page and rank (MHA) or per page (MLA): the page's parts as the host
pool's get_page_buffer_meta lists them (K and V of every layer, in the pool's layout),
concatenated.  batch_get_v1 / batch_set_v1 move a whole batch of pages between the host
pool and the store's memory tier in one engine call, straight from and into the pool.

Failure contract: the v1 calls return one bool per key and never raise and never
return None (a None or an exception ends SGLang's prefetch or backup thread for the
life of the process); batch_exists returns 0 when the store cannot be asked.  Each
failure is logged with the engine's reason.  When the store is gone (its owner
exited, a kv_server restarting) every page fails until it is back: the shared store
takes it over or reconnects (kvengine.shared_store).
"""

import collections
import ctypes
import itertools
import logging
import threading
import time

from .. import error_name, printable_key
from ..fingerprint import check_fingerprint
from ..load_planning import planner_kwargs
from ..shared_store import acquire_store, namespace_config, release_store
from ._sglang_compat import HiCacheStorage, PoolHitPolicy, PoolName, PoolTransferResult
from .keys import PageKeys, model_pattern
from .metrics import StorageCounters
from .planning import PagePlanner

logger = logging.getLogger("kvengine.sglang")

NOT_FOUND = -1
ABORTED = -7
_REASONS_LOGGED = 3  # failed pages named per log line
_LOADED_MAX = 1 << 16  # pages batch_get_v1 remembers for the batch_get_v2 after it

# Side pools whose page is stored in one value with the KV page (a page group): the
# pools SGLang's hybrid controller reads with every KV page (hit policy all_pages, host
# indices those of the KV, PoolTransfer.indices_from_pool == KV), and whose absence its
# consumers do not check after the KV has loaded: DSA's indexer (sglang#30321, a KV
# page paired with a stale or missing indexer page, garbled output), and the draft
# model's KV and indexer (SGLang's draft sidecars, indices_from_pool == KV).  Each
# registered one is laid after the KV page in the order registered.
GROUPED_WITH_KV = (PoolName.INDEXER.value, PoolName.DRAFT.value,
                   PoolName.DRAFT_INDEXER.value)
# Trailing pools (hit policy trailing_pages: a state or window kept only for the last
# pages of a prefix) whose page is stored as a group with the KV page it belongs to: one
# value, the page's KV value as batch_set_v1 stores it, then the pool's page.  SGLang
# backs a node up as batch_set_v2 (the state, keyed by the node's last page hashes) then
# batch_set_v1 (the KV pages); the group is put by that batch_set_v1, when both host
# slots are known.  It reads a prefix back as batch_get_v1 (the KV pages) then
# batch_get_v2 (the state of the trailing pages); batch_get_v2 reads each group whole
# and only then lays its KV over the page batch_get_v1 loaded, so a page's KV and its
# state are always of one put (docs/sglang.md, "Page groups").
# The draft model's SWA window (draft_swa: indices_from_pool == SWA, trailing_pages)
# is one of them too.  On the copy path (no interface_v1) the group's KV part is the
# flat page batch_set stores, and batch_get_v2 loads a state only where that part is
# the flat page batch_get read for the page (_get_groups).
TRAILING_GROUPS = (PoolName.MAMBA.value, PoolName.SWA.value, PoolName.DRAFT_SWA.value)


def _pool_name(name):
    """A PoolName, or the plain string SGLang may pass, as the string value."""
    return name.value if isinstance(name, PoolName) else str(name)


class _SidePool:
    """One side pool of a hybrid model (mamba, swa, indexer, DeepSeek V4's, draft):
    its host pool and the key prefix of its pages."""

    def __init__(self, name, host_pool, prefix, member=None, per_rank=True):
        self.name = name
        self.host_pool = host_pool
        self.prefix = prefix
        self.page_size = getattr(host_pool, "page_size", 1) or 1
        # A trailing pool stored in groups with the KV (TRAILING_GROUPS): its member's
        # name in the group key ("mamba:<part sizes>"), and whether it is a rank's own.
        self.member = member
        self.per_rank = per_rank

    def keys(self, hashes):
        return [self.prefix + h for h in hashes]

    def parts(self, keys, host_indices):
        """(pointers, sizes) of each page's parts in this pool, one list per key."""
        if host_indices is None or host_indices.numel() != len(keys) * self.page_size:
            raise ValueError("%s: %d host indices for %d pages of %d slots" % (
                self.name, 0 if host_indices is None else host_indices.numel(), len(keys),
                self.page_size))
        ptrs, sizes = self.host_pool.get_page_buffer_meta(host_indices)
        n = len(ptrs) // len(keys)
        return ([ptrs[i * n:(i + 1) * n] for i in range(len(keys))],
                [sizes[i * n:(i + 1) * n] for i in range(len(keys))])


def _page_indices(first, page_size):
    """The host indices of the page whose first slot is `first`."""
    import torch

    return torch.arange(first, first + page_size, dtype=torch.int64)


def _policy_holds(page_exists, trailing, prefix_len):
    """Whether a pool allows the prefix of prefix_len pages: all_pages (trailing None),
    it has every page of the prefix; trailing_pages, it has the last `trailing`."""
    first = 0 if trailing is None else max(0, prefix_len - trailing)
    return all(page_exists[i] for i in range(first, prefix_len))


def _page_shape(host_pool):
    """The sizes of one page's parts (what its bytes' layout depends on), for the key."""
    import torch

    one_page = torch.arange(getattr(host_pool, "page_size", 1) or 1, dtype=torch.int64)
    return "+".join(str(int(s)) for s in host_pool.get_page_buffer_meta(one_page)[1])


def _store_location(extra):
    path, attach = extra.get("path"), extra.get("attach")
    if bool(path) == bool(attach):
        raise ValueError("kvengine: the storage backend's extra config must name the store "
                         "with exactly one of 'path' (a DB directory) or 'attach' (the Unix "
                         "socket of a kv_server); got path=%r attach=%r" % (path, attach))
    options = extra.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError("kvengine: 'options' in the extra config must be an object of "
                         "kvengine options, not %r" % (options,))
    return path, attach, options


class KVEngineHiCacheStorage(HiCacheStorage):
    """SGLang's HiCacheStorage over a kvengine store shared by every process of the host.

    Thread-safety: SGLang calls it from its prefetch, prefetch I/O and backup threads at
    once; the store handle is thread-safe and the only state kept here (the counters)
    has its own lock."""

    def __init__(self, storage_config, kwargs=None):
        # StorageBackendFactory's dynamic backends are made as cls(storage_config, kwargs).
        extra = dict(storage_config.extra_config or {})
        path, attach, options = _store_location(extra)
        # Which keys SGLang's lookups (batch_exists, exists) are about: the controller
        # moves pages zero-copy with interface_v1, else as flat pages (the copy path).
        self._zero_copy = bool(extra.get("interface_v1"))
        # batch_exists runs in SGLang's prefetch thread before the pages are read: the
        # store starts bringing the hits up from SSD then (DB::Prefetch; docs/sglang.md).
        self._prefetch = bool(extra.get("prefetch", True))
        if not self._zero_copy:
            logger.warning("kvengine: 'interface_v1' is not set in the extra config, so "
                           "SGLang will move pages through its copy path (batch_get / "
                           "batch_set of flat pages) instead of zero copy; set "
                           "\"interface_v1\": 1")
        # The load planner (planning.py): batch_exists reports only the pages that load
        # no slower than SGLang computes them.  Bad settings raise ValueError naming them.
        kwargs = planner_kwargs(extra, "hicache-storage-backend-extra-config")
        self._planner = PagePlanner(kwargs) if kwargs is not None else None
        namespace, namespace_options = namespace_config(
            extra, "hicache-storage-backend-extra-config")
        self.storage_config = storage_config
        self._store_name = attach or path
        # With "namespace", every page of this instance lives in that namespace of the
        # store (created when missing): docs/sglang.md, "Tenants and namespaces".
        self._store = acquire_store(path, attach, options, namespace, namespace_options)
        self._released = False
        self._counters = StorageCounters(bool(storage_config.enable_storage_metrics))
        self._keys = None
        self._page_bytes = 0
        # MLA: one latent cache for all ranks; rank 0 writes it, every rank reads it.
        self._mla_reader = storage_config.is_mla_model and storage_config.tp_rank != 0
        self.mem_pool_host = None
        # Hybrid models (v2): the KV host pool (the anchor of SGLang's HostPoolGroup),
        # True when that anchor holds no bytes (LogicalHostPool), the side pools by
        # name, and those grouped with each KV page (GROUPED_WITH_KV) as registered.
        self._kv_pool = None
        self._logical_anchor = False
        self._side_pools = {}
        self._grouped = []
        self._trailing = False  # a trailing pool is stored in groups with the KV
        # The most trailing pages a transfer has named (Mamba 1, SWA its window): the
        # copy path keeps that many of the last flat pages batch_get read.
        self._window = 1
        self._registered_ptrs = []
        # Per thread (SGLang's prefetch I/O thread): page hash -> the first host index of
        # the KV page the batch_get_v1 calls since the last batch_get_v2 loaded, so the
        # batch_get_v2 that SGLang calls next finds the KV slots of its pages.  And
        # (SGLang's backup thread) page hash -> [(trailing pool, its first host index)]
        # that batch_set_v2 left for the batch_set_v1 that follows to put as groups.
        self._loaded = threading.local()

    # ------------------------------------------------------------ the host pool

    def register_mem_pool_host(self, mem_pool_host):
        import torch  # SGLang's own dependency; the package imports without it

        super().register_mem_pool_host(mem_pool_host)
        # SGLang's hybrid controller hands over its HostPoolGroup, which answers for
        # its anchor entry (the KV pool): the keys and bytes are the anchor's.
        anchor = getattr(mem_pool_host, "anchor_entry", None)
        kv_pool = anchor.host_pool if anchor is not None else mem_pool_host
        self._kv_pool = kv_pool
        self._logical_anchor = getattr(kv_pool, "kv_buffer", None) is None
        self._keys = PageKeys(self.storage_config, kv_pool)
        config = self.storage_config
        if (config.tp_rank, config.pp_rank, config.attn_cp_rank) == (0, 0, 0):
            # One rank of the instance compares the model's fingerprint with the store's
            # record of it and warns once when it changed (docs/sglang.md).
            check_fingerprint(self._store, self._keys.fingerprint_record_key, self._keys.name,
                              self._keys.fingerprint, self._keys.fingerprint_parts, logger)
        if self._logical_anchor:
            # A logical anchor (DeepSeek V4): indices only, every byte is in side pools.
            logger.info("kvengine: a logical KV anchor; pages live in the side pools")
            return
        one_page = torch.arange(kv_pool.page_size, dtype=torch.int64)
        self._page_bytes = int(sum(kv_pool.get_page_buffer_meta(one_page)[1]))
        self._kv_page_bytes = self._page_bytes  # the KV's own, without grouped pools
        self._register_buffers(kv_pool)
        logger.info("kvengine: pages of %d bytes under %s", self._page_bytes,
                    self._keys.prefix)

    def _register_buffers(self, host_pool):
        """Registers a host pool's tensors with the store (a transport registers them
        once; pages move without it too)."""
        import torch

        get_buffers = getattr(host_pool, "get_hybrid_pool_buffer",
                              lambda: [getattr(host_pool, "kv_buffer", None)])
        for buffer in get_buffers():
            if not isinstance(buffer, torch.Tensor) or buffer.numel() == 0:
                continue
            ptr, size = buffer.data_ptr(), buffer.numel() * buffer.element_size()
            rc = self._store.register_buffer(ptr, size)
            if rc < 0:
                logger.warning("kvengine: could not register a host pool's buffer (%d "
                               "bytes) with the store: %s", size, error_name(rc))
            else:
                self._registered_ptrs.append(ptr)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """A hybrid model's host pool (SGLang's HybridCacheController registers every
        entry of its HostPoolGroup, the KV anchor included, after
        register_mem_pool_host)."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = _pool_name(host_pool_name)
        if name == PoolName.KV.value:
            return  # the anchor: register_mem_pool_host did it
        if self._keys is None:
            raise RuntimeError("register_mem_host_pool_v2(%s) before register_mem_pool_host"
                               % name)
        shape = _page_shape(host_pool)
        # Each TP rank holds its own heads (MHA) or its own slice of a state (mamba,
        # TP-sharded even beside MLA); an MLA model's other side pools are alike on every
        # rank, written by rank 0 (SGLang's should_backup).
        per_rank = not self.storage_config.is_mla_model or name == PoolName.MAMBA.value
        prefix = self._keys.pool_prefix(name, shape, getattr(host_pool, "layout", "-"),
                                        getattr(host_pool, "page_size", 1) or 1, per_rank)
        side = _SidePool(name, host_pool, prefix)
        self._side_pools[name] = side
        self._register_buffers(host_pool)
        # A rank that writes no KV (an MLA model's TP ranks but 0, SGLang's backup_skip)
        # cannot put a group: its trailing pools stay values of their own
        # (docs/sglang.md, "Where a page has no group").  The copy path groups them
        # with the flat KV page its batch_set stores.
        if name in TRAILING_GROUPS and not self._logical_anchor and not self._mla_reader:
            side.member = "%s:%s" % (name, shape)
            side.per_rank = per_rank
            self._trailing = True
        if name in GROUPED_WITH_KV and self._zero_copy and not self._logical_anchor:
            if side.page_size != self._kv_pool.page_size:
                raise ValueError("kvengine: the %s pool's page (%d slots) is not the KV "
                                 "page (%d)" % (name, side.page_size,
                                                self._kv_pool.page_size))
            # A pool registered again replaces its former entry.
            self._grouped = [g for g in self._grouped if g.name != name] + [side]
            shapes = [_page_shape(g.host_pool) for g in self._grouped]
            self._keys.group_with("+".join(
                "%s:%s" % (g.name, sh) for g, sh in zip(self._grouped, shapes)))
            self._page_bytes = self._kv_page_bytes + sum(
                int(x) for sh in shapes for x in sh.split("+"))
        where = prefix
        if side in self._grouped:
            where = self._keys.prefix + " (one value with the KV page)"
        elif side.member is not None:
            where = self._group_keys(side, [""])[0] + " (groups with their KV page)"
        logger.info("kvengine: the %s pool's pages under %s", name, where)

    def _group_keys(self, side, hashes):
        """The keys of a trailing pool's groups: its pages, each with its KV page."""
        prefix = self._keys.group_prefix(side.member, side.per_rank, flat=not self._zero_copy)
        return [prefix + h for h in hashes]

    def _check_indices(self, keys, host_indices):
        pool = self.mem_pool_host
        if pool is None or self._keys is None:
            raise RuntimeError("no host pool registered (register_mem_pool_host)")
        if len(host_indices) != len(keys) * pool.page_size:
            raise ValueError("%d host indices for %d pages of %d tokens" % (
                len(host_indices), len(keys), pool.page_size))

    def _page_parts(self, keys, host_indices):
        """(pointers, sizes) of each page's parts, one list per key."""
        self._check_indices(keys, host_indices)
        ptrs, sizes = self._kv_pool.get_page_buffer_meta(host_indices)
        n = len(ptrs) // len(keys)
        ptrs = [ptrs[i * n:(i + 1) * n] for i in range(len(keys))]
        sizes = [sizes[i * n:(i + 1) * n] for i in range(len(keys))]
        for grouped in self._grouped:
            # The page group: each side pool's page at the same host slots, after the KV.
            side_ptrs, side_sizes = grouped.parts(keys, host_indices)
            ptrs = [a + b for a, b in zip(ptrs, side_ptrs)]
            sizes = [a + b for a, b in zip(sizes, side_sizes)]
        return ptrs, sizes

    # ------------------------------------------------------------ zero copy (v1)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        if self._logical_anchor:
            return [True] * len(keys)  # no KV bytes: the side pools hold the pages
        ok = self._guarded("batch_get_v1", keys, self._get_pages, keys, host_indices)
        if self._grouped or self._trailing:
            # SGLang reads the KV in batches of STORAGE_BATCH_SIZE pages, then the side
            # pools of the whole operation at once: the pages loaded add up until then.
            # Each page loaded: its first host index, and its parts' pointers and sizes
            # (_get_pages worked them out; batch_get_v2 lays a group's KV over them).
            first = host_indices[::self._kv_pool.page_size].tolist()
            loaded = getattr(self._loaded, "pages", {})
            ptrs, sizes = getattr(self._loaded, "parts", None) or ([None] * len(keys),) * 2
            self._loaded.parts = None
            for k, i, good, p, n in zip(keys, first, ok, ptrs, sizes):
                loaded.pop(k, None)
                if good:
                    loaded[k] = (i, p, n)
            # A prefetch that stopped at a miss calls no batch_get_v2 to reset the table:
            # the oldest pages go (a prefix's own are its latest).
            for k in list(itertools.islice(loaded, max(0, len(loaded) - _LOADED_MAX))):
                del loaded[k]
            self._loaded.pages = loaded
        return ok

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        if self._logical_anchor:
            return [True] * len(keys)
        ok = self._guarded("batch_set_v1", keys, self._set_pages, keys, host_indices)
        if self._trailing and not all(ok):
            # SGLang ends the backup at a failed page: the groups batch_set_v2 left for
            # it are not put (its host slots are not the backup's any more after it).
            self._loaded.pending = {}
        return ok

    def _guarded(self, what, keys, fn, *args):
        """fn's per-key bools; all False (logged) when it raises: SGLang's storage
        threads die on an exception or a None."""
        if len(keys) == 0:
            return []
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 -- the contract: never raise into SGLang
            logger.error("kvengine: %s of %d pages failed: %s", what, len(keys), e)
            return [False] * len(keys)

    def _get_pages(self, keys, host_indices):
        ptrs, sizes = self._page_parts(keys, host_indices)
        self._loaded.parts = (ptrs, sizes)
        store_keys = self._keys.pages(keys)
        start = time.perf_counter()
        results = self._store.batch_get_into_multi_buffers(store_keys, ptrs, sizes)
        seconds = time.perf_counter() - start
        ok = [r == self._page_bytes for r in results]
        if self._planner is not None:
            self._planner.read(store_keys, ok, self._page_bytes, seconds)
        read = sum(ok)
        self._log_failures("read", keys, results, ok)
        self._counters.add(read_pages=read, read_bytes=read * self._page_bytes,
                           failed_reads=len(keys) - read)
        self._counters.sample("prefetch", read, read * self._page_bytes, seconds)
        return ok

    def _set_pages(self, keys, host_indices):
        self._check_indices(keys, host_indices)
        store_keys = self._keys.pages(keys)
        present, groups = self._present_with_groups(keys, store_keys)
        if self._planner is not None:
            rewrite = self._planner.rewrite(store_keys)
            present = [p and k not in rewrite for p, k in zip(present, store_keys)]
        if self._mla_reader:
            # Not the MLA writer: the page is stored when rank 0 stored it.
            return present
        missing = [i for i, p in enumerate(present) if not p]
        results = [0] * len(keys)
        seconds, group_bytes = 0.0, 0
        if missing or groups:
            start = time.perf_counter()
            group_bytes = self._put_pages(keys, host_indices, store_keys, missing, groups,
                                          results)
            seconds = time.perf_counter() - start
        ok = [r == 0 for r in results]
        skipped = len(keys) - len(missing)
        written = sum(1 for i in missing if ok[i])
        written_bytes = written * self._page_bytes + group_bytes
        self._log_failures("written", keys, results, ok)
        self._counters.add(written_pages=written, written_bytes=written_bytes,
                           skipped_writes=skipped, failed_writes=len(keys) - sum(ok))
        self._counters.sample("backup", written, written_bytes, seconds)
        return ok

    def _pending_groups(self, keys):
        """[(index into keys, trailing pool, its first host index)]: the groups that the
        batch_set_v2 before this call left for these pages (taken)."""
        pending = getattr(self._loaded, "pending", None)
        if not pending:
            return []
        return [(i, side, first) for i, k in enumerate(keys)
                for side, first in pending.pop(k, [])]

    def _present_with_groups(self, keys, store_keys):
        """([whether each page's own key is stored], the groups batch_set_v2 left for
        these pages that are not stored yet): one engine call asks for both -- the
        group keys ride along with the pages' (batch_set_v2 asks the store nothing)."""
        groups = self._pending_groups(keys)
        group_keys = [self._group_keys(side, [keys[i]])[0] for i, side, _ in groups]
        found = self._store.batch_is_exist(store_keys + group_keys)
        stored = [r == 1 for r in found[len(store_keys):]]
        if any(stored):
            self._counters.add(skipped_writes=sum(stored))
        return ([r == 1 for r in found[:len(store_keys)]],
                [g for g, there in zip(groups, stored) if not there])

    def _put_pages(self, keys, host_indices, store_keys, todo, groups, results):
        """Puts the KV pages todo (indexes into keys) and the groups (_pending_groups)
        in one engine call; results[i] gets the code of page i's KV page, or of a group
        of its that failed.  Returns the bytes of the groups put."""
        ptrs, sizes = self._page_parts(keys, host_indices)
        codes, group_bytes = self._put_with_groups(keys, store_keys, ptrs, sizes, todo,
                                                   groups)
        for i, r in enumerate(codes):
            if results[i] == 0:
                results[i] = r
        return group_bytes

    def _put_with_groups(self, keys, store_keys, ptrs, sizes, todo, groups):
        """Puts the pages todo (indexes into keys, each from its parts ptrs/sizes) and
        the groups, in one engine call: a group is its page's parts (the KV value as
        stored under the page's own key) then the trailing pool's page from the slots
        batch_set_v2 named.  Returns (per page of keys, the code of its put or of a
        group of its that failed; the bytes of the groups put)."""
        put_keys = [store_keys[i] for i in todo]
        put_ptrs = [ptrs[i] for i in todo]
        put_sizes = [sizes[i] for i in todo]
        owner = list(todo)
        for i, side, first in groups:
            side_ptrs, side_sizes = side.parts(["-"], _page_indices(first, side.page_size))
            put_keys.append(self._group_keys(side, [keys[i]])[0])
            put_ptrs.append(ptrs[i] + side_ptrs[0])
            put_sizes.append(sizes[i] + side_sizes[0])
            owner.append(i)
        codes = self._put_values(put_keys, put_ptrs, put_sizes)
        by_page = [0] * len(keys)
        for i, r in zip(owner, codes):
            if by_page[i] == 0:
                by_page[i] = r
        group_bytes = sum(sum(size) for size, r in zip(put_sizes[len(todo):],
                                                        codes[len(todo):]) if r == 0)
        return by_page, group_bytes

    def _put_values(self, keys, ptrs, sizes):
        """Puts each key's value from its parts in one engine call: the codes."""
        codes = [0] * len(keys)
        todo = list(range(len(keys)))
        for _ in range(2):
            put = self._store.batch_put_from_multi_buffers(
                [keys[i] for i in todo], [ptrs[i] for i in todo], [sizes[i] for i in todo])
            for i, r in zip(todo, put):
                codes[i] = r
            # Aborted, attached: the copy into a slot the owner had set aside missed its
            # deadline (a stalled host) and nothing was published; a retry reserves fresh
            # slots.  Once only: a closed store answers Aborted too.
            todo = [i for i in todo if codes[i] == ABORTED]
            if not todo:
                break
        return codes

    def _log_failures(self, verb, keys, results, ok):
        failed = [i for i, good in enumerate(ok) if not good]
        if not failed:
            return
        reasons = []
        for i in failed[:_REASONS_LOGGED]:
            r = results[i]
            why = error_name(r) if r < 0 else "a value of %d bytes, the page has %d" % (
                r, self._page_bytes)
            reasons.append("%s: %s" % (printable_key(keys[i]), why))
        level = logging.INFO if all(results[i] == NOT_FOUND for i in failed) else \
            logging.WARNING
        logger.log(level, "kvengine: %d of %d pages not %s (%s%s)", len(failed), len(keys),
                   verb, "; ".join(reasons), "; ..." if len(failed) > _REASONS_LOGGED else "")

    # ------------------------------------------------------------ lookups

    def batch_exists(self, keys, extra_info=None):
        """How many pages, from the first, this rank's store has: one engine call."""
        if len(keys) == 0 or self._keys is None:
            return 0
        lookup = self._lookup_keys(keys)
        cut = 0
        try:
            planned = None
            if self._planner is not None and self._page_bytes:
                planned = self._planner.plan(self._store, lookup, self._page_bytes,
                                             self.mem_pool_host.page_size)
            if planned is None:
                n = self._store.batch_leading_exist(lookup)
            else:
                n, cut = planned
        except Exception as e:  # noqa: BLE001 -- the prefetch thread must live on
            logger.error("kvengine: batch_exists of %d pages failed: %s", len(keys), e)
            return 0
        if n < 0:
            logger.warning("kvengine: batch_exists of %d pages: the store could not be "
                           "asked (%s); counting none", len(keys), error_name(n))
            n = 0
        self._counters.add(lookup_pages=len(keys), hit_pages=n, recompute_pages=cut)
        if n > 0 and self._prefetch:
            started = self._start_prefetch(lookup[:n])
            if self._planner is not None:
                self._planner.prefetching(started, self._page_bytes)
        return n

    def _start_prefetch(self, keys):
        """The hit pages are read soon: the store starts bringing those on SSD up now.  A
        hint only; a failure changes nothing but the read's speed.  Returns how many it
        started."""
        try:
            results = self._store.batch_prefetch(keys)
        except Exception as e:  # noqa: BLE001 -- an older module, or a store gone away
            logger.debug("kvengine: prefetch not started: %s", e)
            return 0
        return sum(1 for r in results if r == 1)

    def exists(self, key):
        if self._keys is None:
            return False
        return self._store.is_exist(self._lookup_keys([key])[0]) == 1

    def _lookup_keys(self, keys):
        if self._zero_copy:
            return self._keys.pages(keys)
        return [self._keys.flat(k) for k in keys]

    # ------------------------------------------------------------ hybrid models (v2)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix of keys under every pool's hit policy.

        Each side pool's own hits are counted as SGLang's backends count them
        (HiCacheFile, Mooncake), within the KV's leading run: all_pages, its leading run;
        trailing_pages, the longest prefix whose last len(transfer.keys) pages it has.
        kv_hit_pages is the longest prefix at which every policy holds at once -- not the
        least of the per-pool counts, which can name a prefix whose trailing state is
        missing when two trailing pools disagree (sglang#39147).  With one side pool the
        two are the same.  extra_pool_hit_pages: each pool's own count (absent when 0),
        and the KV's."""
        try:
            return self._exists_v2(keys, pool_transfers or [], extra_info)
        except Exception as e:  # noqa: BLE001 -- the prefetch thread must live on
            logger.error("kvengine: batch_exists_v2 of %d pages failed: %s", len(keys), e)
            return PoolTransferResult(0, {})

    def _exists_v2(self, keys, transfers, extra_info):
        kv_pages = len(keys) if self._logical_anchor else self.batch_exists(keys, extra_info)
        hit_count = {PoolName.KV: kv_pages} if kv_pages else {}
        policies = []  # (page_exists, trailing pages or None for all_pages)
        for transfer in transfers:
            if kv_pages == 0:
                break
            page_exists = self._pages_present(transfer.name, keys[:kv_pages])
            trailing = None
            if transfer.hit_policy != PoolHitPolicy.ALL_PAGES:  # trailing_pages
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                self._window = max(self._window, trailing)
            boundary = next((p for p in range(kv_pages, 0, -1)
                             if _policy_holds(page_exists, trailing, p)), 0)
            if boundary:
                hit_count[transfer.name] = boundary
            policies.append((page_exists, trailing))
        usable = next((p for p in range(kv_pages, 0, -1)
                       if all(_policy_holds(e, t, p) for e, t in policies)), 0)
        return PoolTransferResult(usable, hit_count)

    def _pages_present(self, pool_name, hashes):
        """Per page hash, whether the pool's page is stored."""
        side = self._side_pools.get(_pool_name(pool_name))
        if side is None:
            logger.error("kvengine: batch_exists_v2 names the pool %s, which was never "
                         "registered (register_mem_host_pool_v2); counting none", pool_name)
            return [False] * len(hashes)
        if side in self._grouped:
            # One value with its KV page: present exactly where the KV page is (and the
            # caller asks only within the KV's hits).
            return [True] * len(hashes)
        if not hashes:
            return []
        # A trailing pool's page counts where its group (that page's KV and state, of
        # one put) is stored.
        keys = self._group_keys(side, hashes) if side.member else side.keys(hashes)
        return [r == 1 for r in self._store.batch_is_exist(keys)]

    def batch_get_v2(self, transfers, extra_info=None):
        """Each transfer's pages from the store into its host pool: {name: [bool]}.
        The pools stored in groups with the KV are read after the others, in one engine
        call (_get_groups)."""
        loaded = getattr(self._loaded, "pages", {})
        self._loaded.pages = {}
        if not self._zero_copy:
            # The copy path: the last flat pages batch_get read, by hash.
            loaded = getattr(self._loaded, "flat", {})
            self._loaded.flat = collections.OrderedDict()
        transfers = list(transfers or [])
        grouped = [t for t in transfers if self._trailing_side(t.name) is not None]
        results = self._transfers(
            "batch_get_v2", [t for t in transfers if t not in grouped],
            lambda side, keys, host_indices: self._get_pool_pages(side, keys, host_indices,
                                                                  loaded))
        if grouped:
            try:
                results.update(self._get_groups(grouped, loaded))
            except Exception as e:  # noqa: BLE001 -- never raise into SGLang's threads
                logger.error("kvengine: batch_get_v2 of the groups of %s failed: %s",
                             ", ".join(str(t.name) for t in grouped), e)
                results.update({t.name: [False] * len(t.keys or []) for t in grouped})
        return results

    def batch_set_v2(self, transfers, extra_info=None):
        """Each transfer's pages from its host pool into the store (pages already
        stored are not written again): {name: [bool]}.  A trailing pool's pages are
        put, as groups with their KV pages, by the batch_set_v1 SGLang calls next."""
        self._loaded.pending = {}  # a new backup: what an earlier one left is dropped
        return self._transfers("batch_set_v2", transfers, self._set_pool_pages)

    def _trailing_side(self, name):
        side = self._side_pools.get(_pool_name(name))
        return side if side is not None and side.member is not None else None

    def _transfers(self, what, transfers, fn):
        results = {}
        for transfer in transfers or []:
            keys = list(transfer.keys or [])
            if not keys:
                results[transfer.name] = []
                continue
            try:
                side = self._side_pools.get(_pool_name(transfer.name))
                if side is None:
                    raise ValueError("the pool %s was never registered "
                                     "(register_mem_host_pool_v2)" % transfer.name)
                results[transfer.name] = fn(side, keys, transfer.host_indices)
            except Exception as e:  # noqa: BLE001 -- never raise into SGLang's threads
                logger.error("kvengine: %s of %d %s pages failed: %s", what, len(keys),
                             transfer.name, e)
                results[transfer.name] = [False] * len(keys)
        return results

    def _get_pool_pages(self, side, keys, host_indices, loaded):
        if side in self._grouped:
            # The indexer page is in its KV page's value: the batch_get_v1 SGLang made
            # for these pages just now loaded both at once; else read the groups whole
            # (the KV page is written again with the same bytes).
            first = host_indices[::side.page_size].tolist()
            if all(loaded.get(k, (None,))[0] == i for k, i in zip(keys, first)):
                return [True] * len(keys)
            return self._get_pages(keys, host_indices)
        ptrs, sizes = side.parts(keys, host_indices)
        want = [sum(s) for s in sizes]
        results = self._store.batch_get_into_multi_buffers(side.keys(keys), ptrs, sizes)
        ok = [r == w for r, w in zip(results, want)]
        self._log_failures("read (%s)" % side.name, keys, results, ok)
        self._counters.add(read_pages=sum(ok),
                           read_bytes=sum(w for w, good in zip(want, ok) if good),
                           failed_reads=len(keys) - sum(ok))
        return ok

    def _set_pool_pages(self, side, keys, host_indices):
        if side.member is not None:
            return self._leave_groups(side, keys, host_indices)
        if side in self._grouped:
            # Written as the page group, KV and indexer in one value (the host indices
            # are the KV's: indices_from_pool == KV); the batch_set_v1 that follows
            # finds the pages stored.
            return self._set_pages(keys, host_indices)
        store_keys = side.keys(keys)
        present = [r == 1 for r in self._store.batch_is_exist(store_keys)]
        todo = [i for i, p in enumerate(present) if not p]
        results = [0] * len(keys)
        written_bytes = 0
        if todo:
            ptrs, sizes = side.parts(keys, host_indices)
            put = self._store.batch_put_from_multi_buffers(
                [store_keys[i] for i in todo], [ptrs[i] for i in todo],
                [sizes[i] for i in todo])
            for i, r in zip(todo, put):
                results[i] = r
                written_bytes += sum(sizes[i]) if r == 0 else 0
        ok = [r == 0 for r in results]
        self._log_failures("written (%s)" % side.name, keys, results, ok)
        self._counters.add(written_pages=sum(ok) - (len(keys) - len(todo)),
                           written_bytes=written_bytes, skipped_writes=len(keys) - len(todo),
                           failed_writes=len(keys) - sum(ok))
        return ok

    def _leave_groups(self, side, keys, host_indices):
        """batch_set_v2 of a trailing pool: its pages are left for the batch_set_v1 of
        their KV pages, which SGLang calls next in the same backup, to put as groups
        (that call asks the store which groups it has, with the pages, in one engine
        call); True for each (a group's failure fails its KV page's batch_set_v1)."""
        if host_indices is None or host_indices.numel() != len(keys) * side.page_size:
            side.parts(keys, host_indices)  # raises, naming the mismatch
        self._window = max(self._window, len(keys))
        pending = self._loaded.pending
        for k, first in zip(keys, host_indices[::side.page_size].tolist()):
            pending.setdefault(k, []).append((side, first))
        return [True] * len(keys)

    def _get_groups(self, transfers, loaded):
        """batch_get_v2 of the trailing pools stored in groups: each group whole, its
        KV value into a scratch page and its pool page into the transfer's slots, in one
        engine call; then each page read whole gets the group's KV laid over the one
        batch_get_v1 loaded (`loaded`: page hash -> its first KV host index), so its KV
        and its state are of one put.  A group absent, damaged or evicted is a miss of
        the pool's page, and the KV slot keeps the bytes batch_get_v1 reported: a failed
        read never reaches it.  Two pools' groups of one page (SWA and Mamba) must hold
        the same KV bytes, else both are misses."""
        import torch

        results, reads = {}, []  # reads: (name, index in its keys, hash, side parts)
        for t in transfers:
            keys = list(t.keys or [])
            results[t.name] = [False] * len(keys)
            if not keys:
                continue
            side = self._trailing_side(t.name)
            try:
                ptrs, sizes = side.parts(keys, t.host_indices)
            except ValueError as e:
                logger.error("kvengine: batch_get_v2 of %d %s pages: %s", len(keys),
                             side.name, e)
                continue
            for j, h in enumerate(keys):
                if h in loaded:  # else no KV slot of this read to pair the state with
                    reads.append((t.name, j, h, side, ptrs[j], sizes[j]))
        if not reads:
            return results
        page = self._page_bytes if self._zero_copy else self._flat_page_bytes()
        # The thread's scratch pages, kept: a fresh buffer's page faults cost as much as
        # the copy out of it.
        scratch = getattr(self._loaded, "scratch", None)
        if scratch is None or scratch.numel() < len(reads) * page:
            scratch = torch.empty(len(reads) * page, dtype=torch.uint8)
            self._loaded.scratch = scratch
        base = scratch.data_ptr()
        codes = self._store.batch_get_into_multi_buffers(
            [self._group_keys(side, [h])[0] for _, _, h, side, _, _ in reads],
            [[base + n * page] + r[4] for n, r in enumerate(reads)],
            [[page] + r[5] for r in reads])
        good = [c == page + sum(r[5]) for c, r in zip(codes, reads)]
        by_page = {}
        for n, r in enumerate(reads):
            by_page.setdefault(r[2], []).append(n)
        read_bytes = 0
        for h, ns in by_page.items():
            whole = [n for n in ns if good[n]]
            if not whole:
                continue
            kv = scratch[whole[0] * page:(whole[0] + 1) * page]
            if any(not torch.equal(kv, scratch[n * page:(n + 1) * page]) for n in whole[1:]):
                logger.warning("kvengine: the groups of page %s hold different KV bytes "
                               "(puts of two versions); its state is not loaded", h)
                continue
            if not self._zero_copy:
                # The copy path: SGLang has copied the flat page batch_get read into a
                # host slot this backend is not told, so the state loads only where
                # its group's KV is those very bytes.
                flat = loaded[h].contiguous().view(-1).view(torch.uint8)
                if flat.numel() != page or not torch.equal(kv, flat):
                    logger.info("kvengine: the group of page %s holds other KV bytes than "
                                "the page read (another put); its state is not loaded", h)
                    continue
            else:
                _, kv_ptrs, kv_sizes = loaded[h]
                offset = base + whole[0] * page
                for ptr, size in zip(kv_ptrs, kv_sizes):
                    ctypes.memmove(ptr, offset, size)
                    offset += size
            for n in whole:
                results[reads[n][0]][reads[n][1]] = True
                read_bytes += page + sum(reads[n][5])
        ok = sum(sum(v) for v in results.values())
        failed = [n for n, r in enumerate(reads) if not results[r[0]][r[1]]]
        if failed:
            r = reads[failed[0]]
            logger.log(logging.INFO if codes[failed[0]] == NOT_FOUND else logging.WARNING,
                       "kvengine: %d of %d page groups not read (%s of %s: %s)", len(failed),
                       len(reads), printable_key(r[2]), r[3].name,
                       error_name(codes[failed[0]]) if codes[failed[0]] < 0 else
                       "%d bytes" % codes[failed[0]])
        self._counters.add(read_pages=ok, read_bytes=read_bytes,
                           failed_reads=sum(len(v) for v in results.values()) - ok)
        return results

    # ------------------------------------------------------------ the copy path

    def get(self, key, target_location=None, target_sizes=None):
        """Reads the flat page of key into target_location (a tensor; a new flat page
        when None) and returns it; None when absent or on failure."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """A filled tensor or None per key (SGLang's copy path: flat data pages)."""
        if len(keys) == 0:
            return []
        try:
            pool = self.mem_pool_host
            dests = [t if t is not None else pool.get_dummy_flat_data_page()
                     for t in (target_locations or [None] * len(keys))]
            results = self._store.batch_get_into([self._keys.flat(k) for k in keys], dests)
        except Exception as e:  # noqa: BLE001
            logger.error("kvengine: batch_get of %d pages failed: %s", len(keys), e)
            return [None] * len(keys)
        sizes = [d.numel() * d.element_size() for d in dests]
        ok = [r == s for r, s in zip(results, sizes)]
        if self._trailing:
            # The pages batch_get_v2 may pair a state with: its keys are the last pages
            # of the prefix SGLang read, so the last _window pages are kept, no more
            # (a flat page is as large as a KV page: SGLang frees the others).
            kept = getattr(self._loaded, "flat", None) or collections.OrderedDict()
            for k, d, good in zip(keys, dests, ok):
                kept.pop(k, None)
                if good:
                    kept[k] = d
            while len(kept) > self._window:
                kept.popitem(last=False)
            self._loaded.flat = kept
        self._log_failures("read", keys, results, ok)
        read_bytes = sum(s for s, good in zip(sizes, ok) if good)
        self._counters.add(read_pages=sum(ok), read_bytes=read_bytes,
                           failed_reads=len(keys) - sum(ok))
        return [d if good else None for d, good in zip(dests, ok)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Stores each flat page tensor under its key (pages already stored are not
        written again); True when every page is stored."""
        if len(keys) == 0:
            return False
        groups, group_bytes = [], 0
        try:
            flat_keys = [self._keys.flat(k) for k in keys]
            present, groups = self._present_with_groups(keys, flat_keys)
            if self._mla_reader:  # not the MLA writer: stored when rank 0 stored it
                return all(present)
            todo = [i for i, p in enumerate(present) if not p]
            if groups:
                results, group_bytes = self._put_flat_with_groups(keys, values, flat_keys,
                                                                  todo, groups)
                values = [values[i] for i in todo]
            else:
                values = [values[i].contiguous() for i in todo]
                results = self._store.batch_put_from([flat_keys[i] for i in todo], values)
        except Exception as e:  # noqa: BLE001
            logger.error("kvengine: batch_set of %d pages failed: %s", len(keys), e)
            self._loaded.pending = {}
            return False
        failed = sum(1 for r in results if r != 0)
        if failed:
            logger.warning("kvengine: %d of %d pages not written (%s)", failed, len(keys),
                           error_name(next(r for r in results if r != 0)))
            # SGLang ends the backup: the groups left for later pages are not put.
            self._loaded.pending = {}
        written_bytes = group_bytes + sum(v.numel() * v.element_size()
                                          for v, r in zip(values, results) if r == 0)
        self._counters.add(written_pages=len(todo) - failed, written_bytes=written_bytes,
                           skipped_writes=len(keys) - len(todo), failed_writes=failed)
        return failed == 0

    def _put_flat_with_groups(self, keys, values, flat_keys, todo, groups):
        """The copy path's batch_set with the groups batch_set_v2 left for its pages:
        the flat pages todo and each group (the page's flat value, then the trailing
        pool's page) in one engine call.  Returns (the code of each page in todo, then
        the code of a failed group of a page already stored, if any; the bytes of the
        groups put)."""
        flats = [v.contiguous() for v in values]  # alive until the put returns
        ptrs = [[v.data_ptr()] for v in flats]
        sizes = [[v.numel() * v.element_size()] for v in flats]
        by_page, group_bytes = self._put_with_groups(keys, flat_keys, ptrs, sizes, todo,
                                                     groups)
        results = [by_page[i] for i in todo]
        stored = set(todo)
        results += [r for i, r in enumerate(by_page) if r != 0 and i not in stored][:1]
        return results, group_bytes

    def _flat_page_bytes(self):
        page = getattr(self, "_flat_bytes", None)
        if page is None:
            dummy = self.mem_pool_host.get_dummy_flat_data_page()
            page = self._flat_bytes = dummy.numel() * dummy.element_size()
        return page

    # ------------------------------------------------------------ the rest

    def clear(self):
        """Removes every page of this model (all ranks, dtypes and layouts) from the
        store; other models' pages and other integrations' keys (vLLM's) stay."""
        n = self._store.remove_by_regex(model_pattern(self.storage_config.model_name))
        if n < 0:
            logger.error("kvengine: clear failed: %s", error_name(n))
        else:
            logger.info("kvengine: cleared %d pages of %s", n, self.storage_config.model_name)

    def get_stats(self):
        """The interval's KVEngineStorageMetrics (a StorageMetrics), then reset."""
        return self._counters.drain()

    def close(self):
        """Gives back this backend's share of the store (the last share in the process
        closes it; other processes keep theirs).  Idempotent."""
        if self._released:
            return
        self._released = True
        for ptr in self._registered_ptrs:
            self._store.unregister_buffer(ptr)
        self._registered_ptrs = []
        release_store(self._store_name, self._store)
