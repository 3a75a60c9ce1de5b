"""A hybrid model's SGLang instance for the v2 tests (test_sglang_hybrid.py, and the
rank processes of test_sglang_processes.py): its device and host pools (a HostPoolGroup
with the KV pool as anchor and one side pool: Mamba states, SWA pages or DSA's indexer)
and SGLang's HybridCacheController (the stand-in, sglang_fakes.py) with kvengine
attached, driven through the controller's own storage steps."""
import ctypes
import hashlib

import torch

import sglang_fakes as fk
from kvengine.sglang._sglang_compat import PoolHitPolicy, PoolName, PoolTransfer

PAGE = 16
PAGES = 6
SWA_WINDOW = 2  # SWA pages kept per prefix (SGLang: the sliding window in pages)
TOKENS = list(range(7, 7 + PAGES * PAGE))
SMALL = dict(memory_capacity_bytes="64MiB", prefault_memory=False, apply_environment=False)


def fill(tensors, seed):
    g = torch.Generator().manual_seed(seed)
    for t in tensors:
        raw = t.view(-1).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.int32)
                  .to(torch.uint8))


class Hybrid:
    """One instance of a hybrid model: its device pools, host pools (a HostPoolGroup
    with the KV pool as anchor) and HybridCacheController with kvengine attached."""

    def __init__(self, kind, store, seed, rank=0, tp_size=1, interface_v1=1, **options):
        fk.set_parallel(rank, tp_size)
        self.kind = kind
        entries = []
        if kind == "dsa":
            self.kv_dev = fk.DSATokenToKVPool(PAGES * 4 * PAGE, PAGE, 32, torch.bfloat16, 16,
                                              3, "cpu", 128, False, 48)
            self.kv = fk.MLATokenToKVPoolHost(self.kv_dev, 1.0, 0, PAGE, "page_first",
                                              pin_memory=False)
            self.side = fk.DSAIndexerPoolHost(self.kv_dev, self.kv, "page_first",
                                              pin_memory=False)
            side_tensors = self.side.get_hybrid_pool_buffer()
            entries.append(fk.PoolEntry(PoolName.INDEXER, self.side, self.kv_dev,
                                        lambda layer: layer))
        else:
            # mla_mamba: MLA's KV (one latent cache, rank 0 writes it) beside a TP-sharded
            # Mamba state (Kimi Linear).
            self.kv_dev, self.kv = fk.make_pools("mla" if kind == "mla_mamba" else "mha",
                                                 "page_first", torch.bfloat16,
                                                 page_size=PAGE, pages=PAGES * 4)
            if kind in ("mamba", "mla_mamba"):
                self.side_dev = fk.MambaPoolDescriptor(PAGES * 2, 3, [(8, 4), (6,)], (4, 16),
                                                       torch.float32)
                self.side = fk.MambaPoolHost(self.side_dev, 1.0, 0, pin_memory=False,
                                             layout="page_first")
                side_tensors = self.side.get_hybrid_pool_buffer()
                entries.append(fk.PoolEntry(PoolName.MAMBA, self.side, self.side_dev,
                                            lambda layer: None))
            else:  # swa: the sliding-window layers' own K/V pool
                self.side_dev, self.side = fk.make_pools(
                    "mha", "page_first", torch.bfloat16, layers=2, heads=1, head_dim=16,
                    page_size=PAGE, pages=PAGES * 4)
                side_tensors = [self.side.kv_buffer]
                entries.append(fk.PoolEntry(PoolName.SWA, self.side, self.side_dev,
                                            lambda layer: layer))
        entries.insert(0, fk.PoolEntry(PoolName.KV, self.kv, self.kv_dev, lambda layer: layer,
                                       is_primary_index_anchor=True))
        self.group = fk.HostPoolGroup(entries)
        fill([self.kv.kv_buffer], seed)
        fill(side_tensors, seed + 1000)
        extra = fk.kvengine_extra_config(**store, interface_v1=interface_v1,
                                         **dict(SMALL, **options))
        allocator = fk.TokenToKVPoolAllocator(self.kv_dev.size, self.kv_dev.dtype, "cpu",
                                              self.kv_dev, False)
        self.c = fk.HybridCacheController(allocator, self.group, PAGE, None, None,
                                          storage_backend="dynamic", model_name="test/hybrid",
                                          storage_backend_extra_config=extra)
        self.backend = self.c.storage_backend

    # ---------------------------------------------------------------- SGLang's steps

    def transfers(self, hashes, side_slots=None):
        """The side pool's PoolTransfer as SGLang's tree builds it."""
        if self.kind == "dsa":
            return [PoolTransfer(name=PoolName.INDEXER, hit_policy=PoolHitPolicy.ALL_PAGES,
                                 indices_from_pool=PoolName.KV)]
        n = 1 if self.kind != "swa" else SWA_WINDOW
        name = PoolName.MAMBA if self.kind != "swa" else PoolName.SWA
        return [PoolTransfer(name=name, host_indices=side_slots, keys=list(hashes[-n:]),
                             hit_policy=PoolHitPolicy.TRAILING_PAGES)]

    def side_slots(self, pages):
        if self.kind == "dsa":
            return None
        n = 1 if self.kind != "swa" else SWA_WINDOW
        return self.side.alloc(min(n, pages) * self.side.page_size)

    def backup(self, tokens=TOKENS):
        """Writes every page of tokens (KV) and the side pool's pages of its tail."""
        hashes = fk.get_hash_str(tokens, None, PAGE)
        slots = self.kv.alloc(len(hashes) * PAGE)
        side_slots = self.side_slots(len(hashes))
        op = fk.HybridStorageOperation(slots, tokens, hash_value=hashes,
                                       pool_transfers=self.transfers(hashes, side_slots))
        self.c._page_backup(op)
        return op, self.snapshot(op)

    def prefetch(self, tokens=TOKENS, skip=3):
        """The prefetch thread's steps: the hit query (batch_exists_v2), host slots for
        the hit (after `skip` pages, so they differ from the writer's), the transfer."""
        hashes = fk.get_hash_str(tokens, None, PAGE)
        op = fk.HybridPrefetchOperation("r", tokens,
                                        pool_transfers=self.transfers(hashes))
        hit_hashes, _ = self.c._storage_hit_query(op)
        self.kv.alloc(skip * PAGE)
        op.hash_value = hit_hashes
        op.host_indices = self.kv.alloc(len(hit_hashes) * PAGE)
        for t in op.pool_transfers:
            if t.indices_from_pool is None:
                t.host_indices = self.side_slots(len(hit_hashes))
        self.c._page_transfer(op)
        return op, self.snapshot(op)

    def snapshot(self, op):
        """(KV page bytes, side page bytes) of what an operation moved, by page hash."""
        kv = {h: page_bytes(self.kv.get_data_page(int(op.host_indices[i * PAGE])))
              for i, h in enumerate(op.hash_value)}
        side = {}
        for t in op.pool_transfers or []:
            if t.keys is None or t.host_indices is None:
                continue
            ps = self.side.page_size
            for i, h in enumerate(t.keys):
                side[h] = side_bytes(self.side, int(t.host_indices[i * ps]))
        return kv, side


def digests(h, op):
    """The SHA-256 of each KV page and side page an operation moved, by page hash."""
    kv, side = h.snapshot(op)
    return ({k: hashlib.sha256(v).hexdigest() for k, v in kv.items()},
            {k: hashlib.sha256(v).hexdigest() for k, v in side.items()})


def page_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def side_bytes(pool, index):
    ptrs, sizes = pool.get_page_buffer_meta(torch.arange(index, index + pool.page_size))
    return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))


# ---------------------------------------------------------------- crash rounds

CRASH_OPTIONS = dict(memory_capacity_bytes="16MiB")


def stamp(pool, indices, version):
    """Fills each part of the pages at `indices` (one host index per page) with the
    8-byte version repeated: every byte of a put names its version."""
    word = int(version).to_bytes(8, "little")
    for first in indices:
        ptrs, sizes = pool.get_page_buffer_meta(
            torch.arange(first, first + (getattr(pool, "page_size", 1) or 1)))
        for p, s in zip(ptrs, sizes):
            ctypes.memmove(p, word * (s // 8), s)


def crash_writer(conn, path, policy, seed):
    """A backup thread that SIGKILL ends (test_sglang_hybrid.py's crash rounds): SGLang's
    steps, batch_set_v2 of a prefix's Mamba state then batch_set_v1 of its KV pages, for
    prefixes of 1..PAGES pages, each time with every page and state stamped with a new
    version; groups and KV pages are removed at random so that later backups put other
    versions of them; a flush now and then."""
    import random

    h = Hybrid("mamba", {"path": path}, seed, offload_policy=policy, **CRASH_OPTIONS)
    db = h.backend._store
    side = h.backend._side_pools[PoolName.MAMBA.value]
    rng = random.Random(seed)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    kv_slots = h.kv.alloc(PAGES * PAGE)
    state_slots = h.side.alloc(PAGES)
    for n in range(1 << 30):
        version = rng.getrandbits(63)
        stamp(h.kv, kv_slots[::PAGE].tolist(), version)
        stamp(h.side, state_slots.tolist(), version)
        if rng.random() < 0.5:
            j = rng.randrange(PAGES)
            db.remove(h.backend._group_keys(side, [hashes[j]])[0])
            if rng.random() < 0.3:
                db.remove(h.backend._keys.pages([hashes[j]])[0])
        k = rng.randint(1, PAGES)
        h.backend.batch_set_v2([PoolTransfer(
            name=PoolName.MAMBA, host_indices=state_slots[k - 1:k], keys=[hashes[k - 1]],
            hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        h.backend.batch_set_v1(hashes[:k], kv_slots[:k * PAGE])
        if n % 8 == 7:
            db.flush()
        if n == 16:
            conn.send(("ready", None))
