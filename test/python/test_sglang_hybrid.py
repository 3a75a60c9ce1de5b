"""SGLang's v2 storage interface (hybrid models) through kvengine's HiCache backend:
SGLang's HybridCacheController steps (the stand-in, sglang_fakes.py) over a real store,
for the pool sets its hybrid models register -- MHA + Mamba (Qwen3-Next, Jamba), MHA +
SWA (gpt-oss), MLA + the DSA indexer (DeepSeek V3.2) -- bit-exact, with the hit
policies, and the page group (a KV page and its indexer page in one value) that is
present whole or not at all: removed, evicted or damaged between the hit query and the
read, it reads as a miss, never as a KV page beside a stale or missing indexer page.
test_sglang_processes.py::test_hybrid_pools_across_attached_processes runs the hybrid
sets across processes."""
import glob
import os

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import sglang_fakes as fk  # noqa: E402
from kvengine.sglang._sglang_compat import PoolHitPolicy, PoolName, PoolTransfer  # noqa: E402
from sglang_hybrid import PAGE, PAGES, TOKENS, Hybrid  # noqa: E402
from sglang_hybrid import page_bytes as _bytes  # noqa: E402
from sglang_hybrid import side_bytes as _side_bytes  # noqa: E402

@pytest.fixture
def store(db_path):
    return {"path": db_path}


# ---------------------------------------------------------------- end to end, bit-exact

@pytest.mark.parametrize("kind", ["mamba", "swa", "dsa"])
def test_hybrid_pages_round_trip_bit_exact_through_the_controller(store, kind):
    a = Hybrid(kind, store, seed=1)
    b = Hybrid(kind, store, seed=2)
    op, (kv_saved, side_saved) = a.backup()
    assert op.completed_tokens == PAGES * PAGE
    result, (kv_loaded, side_loaded) = b.prefetch()
    assert result.completed_tokens == PAGES * PAGE
    assert result.pool_storage_result.kv_hit_pages == PAGES
    assert kv_loaded == kv_saved
    if kind == "dsa":
        # The indexer pages sit at the KV's slots; every one of them came along.
        for i, h in enumerate(result.hash_value):
            slot = int(result.host_indices[i * PAGE])
            assert _side_bytes(b.side, slot) == _side_bytes(
                a.side, int(op.host_indices[i * PAGE])), i
        assert result.pool_storage_result.extra_pool_hit_pages[PoolName.INDEXER] == PAGES
    else:
        assert side_loaded == side_saved and len(side_saved) >= 1
        name = PoolName.MAMBA if kind == "mamba" else PoolName.SWA
        assert result.pool_storage_result.extra_pool_hit_pages[name] == len(side_saved)
    # Written once: a second backup of the same pages writes nothing.
    before = a.backend.get_stats()
    a.backup()
    after = a.backend.get_stats()
    assert after.written_pages == 0 and after.skipped_writes > 0, (before, after)


def test_the_kv_of_a_model_without_side_pools_keeps_its_v1_key(store):
    """Registering a trailing pool (mamba) leaves the KV value and key as v1 has them:
    only the indexer is grouped with its KV page."""
    h = Hybrid("mamba", store, seed=3)
    assert "@mhaL4H2D32@page_first@ps16@" in h.backend._keys.prefix
    d = Hybrid("dsa", store, seed=3)
    assert "@page_first+indexer:" in d.backend._keys.prefix


# ---------------------------------------------------------------- hit policies

def _pattern(h, present):
    """Stores, for PAGES page hashes, the KV of every page and the side pool's page of
    those in `present`; returns the hashes."""
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = h.kv.alloc(PAGES * PAGE)
    assert all(h.backend.batch_set_v1(hashes, slots))
    side = h.backend._side_pools[h.transfers(hashes)[0].name.value]
    for i in present:
        s = h.side.alloc(h.side.page_size)
        r = h.backend.batch_set_v2([PoolTransfer(name=side.name, host_indices=s,
                                                 keys=[hashes[i]])])
        assert r[side.name] == [True]
    return hashes


@pytest.mark.parametrize("kind,present,trailing,usable", [
    ("mamba", [2], 1, 3),            # the state after page 2: a prefix of 3 pages
    ("mamba", [1, 4], 1, 5),         # the longest prefix whose last page has a state
    ("mamba", [], 1, 0),
    ("swa", [2, 3, 5], 2, 4),        # the window [2, 4) is there, [4, 6) is not
    ("swa", [0, 2, 4], 2, 1),        # no two neighbours: only the first page's prefix
    ("swa", [0, 1, 2, 3, 4, 5], 3, 6),
])
def test_trailing_pages_follow_sglangs_policy(store, kind, present, trailing, usable):
    h = Hybrid(kind, store, seed=4)
    hashes = _pattern(h, present)
    t = PoolTransfer(name=PoolName.MAMBA if kind == "mamba" else PoolName.SWA,
                     keys=hashes[-trailing:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    r = h.backend.batch_exists_v2(hashes, [t])
    assert r.kv_hit_pages == usable
    assert r.extra_pool_hit_pages.get(t.name, 0) == usable
    assert r.extra_pool_hit_pages[PoolName.KV] == PAGES


def test_all_pages_counts_the_leading_run_within_the_kvs(store):
    """An all_pages side pool that is not grouped (DeepSeek V4's compressed pools are
    values of their own): its leading run bounds the prefix."""
    h = Hybrid("swa", store, seed=5)
    h.backend.register_mem_host_pool_v2(h.side, PoolName.DEEPSEEK_V4_C4)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    assert all(h.backend.batch_set_v1(hashes, h.kv.alloc(PAGES * PAGE)))
    first = hashes[:4] + hashes[5:]
    slots = h.side.alloc(len(first) * PAGE)
    r = h.backend.batch_set_v2([PoolTransfer(name=PoolName.DEEPSEEK_V4_C4,
                                             host_indices=slots, keys=first)])
    assert r[PoolName.DEEPSEEK_V4_C4] == [True] * len(first)
    t = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, hit_policy=PoolHitPolicy.ALL_PAGES)
    r = h.backend.batch_exists_v2(hashes, [t])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages[PoolName.DEEPSEEK_V4_C4]) == (4, 4)


def test_two_trailing_pools_give_the_prefix_both_allow_not_the_least_count(store):
    """sglang#39147: with a mamba state at page 4 only (mamba's own count: 5) and SWA
    pages [0, 3) (SWA's own count: 3), the least of the counts, 3, names a prefix whose
    mamba state (page 2) is missing.  The usable prefix is one where both hold: none
    here."""
    h = Hybrid("swa", store, seed=6)
    h.backend.register_mem_host_pool_v2(h.side, PoolName.MAMBA)  # a second trailing pool
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    assert all(h.backend.batch_set_v1(hashes, h.kv.alloc(PAGES * PAGE)))

    def put(name, pages):
        slots = h.side.alloc(len(pages) * PAGE)
        r = h.backend.batch_set_v2([PoolTransfer(name=name, host_indices=slots,
                                                 keys=[hashes[i] for i in pages])])
        assert all(r[name])

    put(PoolName.MAMBA, [4])
    put(PoolName.SWA, [0, 1, 2])
    ts = [PoolTransfer(name=PoolName.MAMBA, keys=hashes[-1:],
                       hit_policy=PoolHitPolicy.TRAILING_PAGES),
          PoolTransfer(name=PoolName.SWA, keys=hashes[-2:],
                       hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    r = h.backend.batch_exists_v2(hashes, ts)
    assert r.extra_pool_hit_pages[PoolName.MAMBA] == 5
    assert r.extra_pool_hit_pages[PoolName.SWA] == 3
    assert r.kv_hit_pages == 0
    put(PoolName.MAMBA, [2])
    assert h.backend.batch_exists_v2(hashes, ts).kv_hit_pages == 3


# ---------------------------------------------------------------- the page group

def _grouped_keys(h, hashes):
    return h.backend._keys.pages(hashes)


def _hit_then(h, hashes, between):
    """The hit query, then `between` (a removal, an eviction, damage), then the read:
    returns the prefetch operation after its transfer."""
    op = fk.HybridPrefetchOperation("r", TOKENS, pool_transfers=h.transfers(hashes))
    hit_hashes, _ = h.c._storage_hit_query(op)
    assert len(hit_hashes) == PAGES
    between()
    op.hash_value = hit_hashes
    op.host_indices = h.kv.alloc(len(hit_hashes) * PAGE)
    h.c._page_transfer(op)
    return op


def _zero(h):
    h.kv.kv_buffer.zero_()
    h.side.index_k_with_scale_buffer.zero_()


def _assert_whole_or_untouched(h, a, op_a, op):
    """Every page the read reports loaded has both its KV and its indexer page, each the
    writer's; every other page of the read left both pools' slots as they were (zero)."""
    loaded = op.completed_tokens // PAGE
    for i in range(PAGES):
        slot = int(op.host_indices[i * PAGE])
        kv = _bytes(h.kv.get_data_page(slot))
        ix = _side_bytes(h.side, slot)
        src = int(op_a.host_indices[i * PAGE])
        if i < loaded:
            assert kv == _bytes(a.kv.get_data_page(src)), i
            assert ix == _side_bytes(a.side, src), i
        else:
            # A page not loaded is never half there: neither its KV nor its indexer.
            assert (kv == bytes(len(kv))) == (ix == bytes(len(ix))), i
    return loaded


def test_a_group_removed_between_exists_and_get_reads_as_a_miss(store):
    a = Hybrid("dsa", store, seed=7)
    op_a, _ = a.backup()
    hashes = op_a.hash_value
    h = Hybrid("dsa", store, seed=8)
    _zero(h)
    key = _grouped_keys(h, hashes)[3]
    op = _hit_then(h, hashes, lambda: h.backend._store.remove(key))
    assert _assert_whole_or_untouched(h, a, op_a, op) == 3
    assert op.is_terminated()  # SGLang stops at the miss; pages 3.. are recomputed


def test_a_group_evicted_between_exists_and_get_reads_as_a_miss(store):
    """Eviction pressure: the store's memory tier is small and the SSD tier off, so
    pages written after the hit query push the group out."""
    a = Hybrid("dsa", store, seed=9, memory_capacity_bytes="4MiB", ssd_capacity_bytes=0)
    op_a, _ = a.backup()
    hashes = op_a.hash_value
    h = a  # the same instance reads them back into other slots
    keys = _grouped_keys(h, hashes)
    page = h.backend._page_bytes

    def pressure():
        filler = bytes(page)
        n = 0
        while all(r == 1 for r in h.backend._store.batch_is_exist(keys)) and n < 4096:
            h.backend._store.put("filler/%d" % n, filler)
            n += 1
        assert n < 4096, "nothing was evicted"

    saved = {i: (_bytes(a.kv.get_data_page(int(op_a.host_indices[i * PAGE]))),
                 _side_bytes(a.side, int(op_a.host_indices[i * PAGE]))) for i in range(PAGES)}
    op = _hit_then(h, hashes, pressure)
    present = [r == 1 for r in h.backend._store.batch_is_exist(keys)]
    loaded = op.completed_tokens // PAGE
    assert loaded == (present.index(False) if False in present else PAGES)
    for i in range(loaded):
        slot = int(op.host_indices[i * PAGE])
        assert (_bytes(h.kv.get_data_page(slot)), _side_bytes(h.side, slot)) == saved[i]


def test_a_damaged_group_reads_as_a_miss_and_never_half(store, tmp_path):
    """A group whose bytes on SSD are damaged fails its checksum whole: neither its KV
    page nor its indexer page is reported loaded."""
    options = dict(offload_policy="write_through", memory_capacity_bytes="64MiB")
    a = Hybrid("dsa", store, seed=10, **options)
    op_a, _ = a.backup()
    hashes = op_a.hash_value
    a.backend._store.flush()
    path = store["path"]
    a.c.detach_storage_backend()
    buckets = sorted(glob.glob(os.path.join(path, "**", "bucket-*.kvb"), recursive=True))
    assert buckets, os.listdir(path)
    # Damage the middle of the data (the values; the footer and index stay readable).
    for b in buckets:
        size = os.path.getsize(b)
        with open(b, "r+b") as f:
            f.seek(size // 3)
            chunk = f.read(64)
            f.seek(size // 3)
            f.write(bytes(x ^ 0xFF for x in chunk))
    h = Hybrid("dsa", store, seed=11, **options)
    _zero(h)
    op = fk.HybridPrefetchOperation("r", TOKENS, pool_transfers=h.transfers(hashes))
    hit_hashes, _ = h.c._storage_hit_query(op)
    op.hash_value = hit_hashes
    op.host_indices = h.kv.alloc(len(hit_hashes) * PAGE)
    h.c._page_transfer(op)
    loaded = op.completed_tokens // PAGE
    # The damage is found when the group is read (its checksum), not by the hit query.
    assert len(hit_hashes) == PAGES and loaded < PAGES, "no damage was seen"
    for i in range(len(hit_hashes)):
        slot = int(op.host_indices[i * PAGE])
        src = int(op_a.host_indices[i * PAGE])
        kv, ix = _bytes(h.kv.get_data_page(slot)), _side_bytes(h.side, slot)
        if i < loaded:
            assert kv == _bytes(a.kv.get_data_page(src)) and ix == _side_bytes(a.side, src)


def test_the_indexer_is_written_with_its_kv_page_in_one_value(store):
    """batch_set_v2 of the indexer (SGLang calls it before the KV's batch_set_v1) puts
    the whole group; the KV's batch_set_v1 then finds it stored.  One key per page."""
    a = Hybrid("dsa", store, seed=12)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = a.kv.alloc(PAGES * PAGE)
    r = a.backend.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=slots,
                                             keys=hashes, indices_from_pool=PoolName.KV)])
    assert r[PoolName.INDEXER] == [True] * PAGES
    store_ = a.backend._store
    assert all(x == 1 for x in store_.batch_is_exist(_grouped_keys(a, hashes)))
    stats = a.backend.get_stats()
    assert all(a.backend.batch_set_v1(hashes, slots))
    assert a.backend.get_stats().skipped_writes == PAGES, stats
    # The value is the KV page, then the indexer page.
    value = store_.get(_grouped_keys(a, hashes)[0])
    first = int(slots[0])
    assert value == _bytes(a.kv.get_data_page(first)) + _side_bytes(a.side, first)


def test_a_logical_anchor_keeps_every_byte_in_its_side_pools(store):
    """DeepSeek V4: the anchor (LogicalHostPool) holds indices and no bytes; the KV's v1
    calls move nothing and its pages count as present, and the side pools' pages decide
    the hit (all_pages) and move bit-exact."""
    def instance(seed):
        fk.set_parallel(0, 1)
        anchor = fk.LogicalHostPool(PAGES * 4 * PAGE, PAGE, "page_first")
        dev, side = fk.make_pools("mla", "page_first", torch.bfloat16, page_size=PAGE,
                                  pages=PAGES * 4)
        fk.fill_random(side, seed)
        group = fk.HostPoolGroup([
            fk.PoolEntry(PoolName.KV, anchor, None, None, is_primary_index_anchor=True),
            fk.PoolEntry(PoolName.DEEPSEEK_V4_C4, side, dev, None)])
        allocator = fk.TokenToKVPoolAllocator(dev.size, dev.dtype, "cpu", dev, False)
        c = fk.HybridCacheController(
            allocator, group, PAGE, None, None, storage_backend="dynamic",
            model_name="test/v4", storage_backend_extra_config=fk.kvengine_extra_config(
                **store, memory_capacity_bytes="64MiB", prefault_memory=False,
                apply_environment=False))
        return c, anchor, side

    def c4(hashes, slots=None):
        return [PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=slots, keys=hashes,
                             hit_policy=PoolHitPolicy.ALL_PAGES)]

    a, anchor_a, side_a = instance(21)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = anchor_a.alloc(PAGES * PAGE)
    assert a.storage_backend.batch_set_v1(hashes, slots) == [True] * PAGES
    first = hashes[:4]
    assert a.storage_backend.batch_set_v2(c4(first, slots[:4 * PAGE])) == \
        {PoolName.DEEPSEEK_V4_C4: [True] * 4}
    b, anchor_b, side_b = instance(22)
    r = b.storage_backend.batch_exists_v2(hashes, c4(None))
    assert (r.kv_hit_pages, r.extra_pool_hit_pages[PoolName.KV],
            r.extra_pool_hit_pages[PoolName.DEEPSEEK_V4_C4]) == (4, PAGES, 4)
    other = anchor_b.alloc(2 * PAGE + 4 * PAGE)[2 * PAGE:]
    assert b.storage_backend.batch_get_v1(first, other) == [True] * 4
    assert b.storage_backend.batch_get_v2(c4(first, other)) == \
        {PoolName.DEEPSEEK_V4_C4: [True] * 4}
    for i in range(4):
        assert fk.page_bytes(side_b, int(other[i * PAGE])) == \
            fk.page_bytes(side_a, int(slots[i * PAGE]))


def test_the_indexers_get_reads_nothing_after_the_kvs_batches(store):
    """SGLang reads the KV in batches (STORAGE_BATCH_SIZE pages), then the indexer of the
    whole operation in one batch_get_v2: the groups came with the KV's batches, so it
    reads nothing; pages it was not given by them it reads whole."""
    a = Hybrid("dsa", store, seed=24)
    a.backup()
    b = Hybrid("dsa", store, seed=25)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = b.kv.alloc(PAGES * PAGE)
    assert all(b.backend.batch_get_v1(hashes[:4], slots[:4 * PAGE]))
    assert all(b.backend.batch_get_v1(hashes[4:], slots[4 * PAGE:]))
    b.backend.get_stats()
    indexer = [PoolTransfer(name=PoolName.INDEXER, host_indices=slots, keys=hashes,
                            indices_from_pool=PoolName.KV)]
    assert b.backend.batch_get_v2(indexer) == {PoolName.INDEXER: [True] * PAGES}
    assert b.backend.get_stats().read_pages == 0
    # Without the KV's reads before it, it reads the groups itself.
    assert b.backend.batch_get_v2(indexer) == {PoolName.INDEXER: [True] * PAGES}
    assert b.backend.get_stats().read_pages == PAGES


# ---------------------------------------------------------------- failure contract

def test_v2_calls_never_raise(store):
    h = Hybrid("mamba", store, seed=13)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    bad = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(5), keys=hashes[:2])
    assert h.backend.batch_set_v2([bad]) == {PoolName.MAMBA: [False, False]}
    assert h.backend.batch_get_v2([bad]) == {PoolName.MAMBA: [False, False]}
    unknown = PoolTransfer(name=PoolName.DRAFT_SWA, host_indices=torch.arange(2),
                           keys=hashes[:2])
    assert h.backend.batch_get_v2([unknown]) == {PoolName.DRAFT_SWA: [False, False]}
    assert all(h.backend.batch_set_v1(hashes, h.kv.alloc(PAGES * PAGE)))
    r = h.backend.batch_exists_v2(hashes, [PoolTransfer(name=PoolName.DRAFT_SWA)])
    assert r.kv_hit_pages == 0
