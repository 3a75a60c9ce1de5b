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
    those in `present` (each a group with its KV page), in SGLang's order: the side
    pool's batch_set_v2, then the KV's batch_set_v1; returns the hashes."""
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = h.kv.alloc(PAGES * PAGE)
    side = h.backend._side_pools[h.transfers(hashes)[0].name.value]
    s = h.side.alloc(len(present) * h.side.page_size)
    r = h.backend.batch_set_v2([PoolTransfer(name=side.name, host_indices=s,
                                             keys=[hashes[i] for i in present])])
    assert r[side.name] == [True] * len(present)
    assert all(h.backend.batch_set_v1(hashes, slots))
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
    kv_slots = h.kv.alloc(PAGES * PAGE)

    def put(name, pages):
        slots = h.side.alloc(len(pages) * PAGE)
        r = h.backend.batch_set_v2([PoolTransfer(name=name, host_indices=slots,
                                                 keys=[hashes[i] for i in pages])])
        assert all(r[name])
        assert all(h.backend.batch_set_v1(hashes, kv_slots))

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


# ---------------------------------------------------------------- trailing state groups

def _group_key(h, page_hash, name=None):
    side = h.backend._side_pools[name or h.transfers([page_hash])[0].name.value]
    return h.backend._group_keys(side, [page_hash])[0]


def _read_with(h, between, tokens=TOKENS):
    """SGLang's prefetch of tokens into zeroed pools, `between` run after the hit query
    and before the transfer; returns the operation."""
    h.kv.kv_buffer.zero_()
    for t in h.side.get_hybrid_pool_buffer() if h.kind != "swa" else [h.side.kv_buffer]:
        t.zero_()
    hashes = fk.get_hash_str(tokens, None, PAGE)
    op = fk.HybridPrefetchOperation("r", tokens, pool_transfers=h.transfers(hashes))
    hit_hashes, _ = h.c._storage_hit_query(op)
    assert len(hit_hashes) == len(hashes)
    between()
    op.hash_value = hit_hashes
    op.host_indices = h.kv.alloc(len(hit_hashes) * PAGE)
    for t in op.pool_transfers:
        t.host_indices = h.side_slots(len(hit_hashes))
    h.c._page_transfer(op)
    return op


def _check_never_mixed(h, op, kv_saved, side_saved):
    """Every KV page the read reports loaded is the writer's; every state page it reports
    loaded is the writer's, and so is the KV page beside it (one put).  Returns the
    pages whose state loaded."""
    for i in range(op.completed_tokens // PAGE):
        kv = _bytes(h.kv.get_data_page(int(op.host_indices[i * PAGE])))
        assert kv == kv_saved[op.hash_value[i]], i
    t = op.pool_transfers[0]
    if op.completed_tokens // PAGE < len(op.hash_value):
        return []  # SGLang reads no state after a KV miss
    n = op.pool_storage_result.extra_pool_hit_pages.get(t.name, 0)
    for j in range(n):
        assert _side_bytes(h.side, int(t.host_indices[j * h.side.page_size])) == \
            side_saved[t.keys[j]], j
    return t.keys[:n]


@pytest.mark.parametrize("kind", ["mamba", "swa"])
def test_a_trailing_state_is_one_value_with_its_kv_page(store, kind):
    """The state of a prefix's last pages is stored as a group with each page's KV: one
    key, the KV page then the state; pages without a state have no group, and the state
    has no key of its own."""
    a = Hybrid(kind, store, seed=30)
    op, (kv_saved, side_saved) = a.backup()
    db = a.backend._store
    trailing = op.pool_transfers[0].keys
    assert len(trailing) == (1 if kind == "mamba" else 2)
    for h in op.hash_value:
        if h in trailing:
            assert db.get(_group_key(a, h)) == kv_saved[h] + side_saved[h]
        else:
            assert db.is_exist(_group_key(a, h)) == 0
        assert db.is_exist(a.backend._keys.pages([h])[0]) == 1  # the KV page, as in v1
    side = a.backend._side_pools[op.pool_transfers[0].name.value]
    assert all(r == 0 for r in db.batch_is_exist(side.keys(op.hash_value)))
    assert "+%s:" % kind in _group_key(a, trailing[0])
    # The groups' bytes count as written (SGLang's backup metrics).
    b = Hybrid(kind, {"path": a.backend._store_name + "-b"}, seed=30)
    b.backend.get_stats()
    b.backup()
    stats = b.backend.get_stats()
    assert stats.written_bytes == sum(map(len, kv_saved.values())) + sum(
        len(kv_saved[h]) + len(side_saved[h]) for h in trailing), stats


@pytest.mark.parametrize("kind", ["mamba", "swa"])
def test_a_state_group_deleted_between_exists_and_get_is_a_miss_whole(store, kind):
    """The group of the prefix's last page deleted after the hit query: its state is not
    reported loaded, its slot is not written, and the KV slot of the page keeps the KV
    page batch_get_v1 read (a failed group read never reaches it)."""
    a = Hybrid(kind, store, seed=31)
    op_a, (kv_saved, side_saved) = a.backup()
    last = op_a.hash_value[-1]
    b = Hybrid(kind, store, seed=32)
    op = _read_with(b, lambda: b.backend._store.remove(_group_key(b, last)))
    assert op.completed_tokens == PAGES * PAGE
    t = op.pool_transfers[0]
    assert t.keys[-1] == last
    loaded = _check_never_mixed(b, op, kv_saved, side_saved)
    assert last not in loaded
    assert len(loaded) == len(t.keys) - 1  # SWA: the window's first page still loads
    slot = int(t.host_indices[(len(t.keys) - 1) * b.side.page_size])
    assert not any(_side_bytes(b.side, slot))


def test_a_state_group_replaced_between_exists_and_get_loads_its_own_kv(store):
    """A group put again between the hit query and the read (another version of the
    page: other KV bytes, another state): the state is loaded with the KV page of its
    own put, laid over the one batch_get_v1 read from the page's plain key."""
    a = Hybrid("mamba", store, seed=33)
    op_a, (kv_saved, side_saved) = a.backup()
    last = op_a.hash_value[-1]
    b = Hybrid("mamba", store, seed=34)
    value = bytearray(b.backend._store.get(_group_key(b, last)))
    new = bytes(x ^ 0x5A for x in value)
    kv_bytes = len(kv_saved[last])

    def replace():
        assert b.backend._store.remove(_group_key(b, last)) >= 0
        assert b.backend._store.put(_group_key(b, last), new) == 0

    op = _read_with(b, replace)
    assert op.completed_tokens == PAGES * PAGE
    t = op.pool_transfers[0]
    assert op.pool_storage_result.extra_pool_hit_pages[t.name] == 1
    assert _side_bytes(b.side, int(t.host_indices[0])) == new[kv_bytes:]
    assert _bytes(b.kv.get_data_page(int(op.host_indices[-PAGE]))) == new[:kv_bytes]
    for i in range(PAGES - 1):  # the pages before: the writer's, from their own keys
        assert _bytes(b.kv.get_data_page(int(op.host_indices[i * PAGE]))) == \
            kv_saved[op.hash_value[i]]


@pytest.mark.parametrize("kind", ["mamba", "swa"])
def test_a_damaged_state_group_is_a_miss_and_leaves_the_kv_page_alone(store, kind):
    """A byte of a state group flipped on SSD (the state's own bytes, found in the
    buckets): the group fails its checksum whole; its state is not reported loaded and
    the KV slot of its page keeps the bytes batch_get_v1 read."""
    options = dict(offload_policy="write_through", memory_capacity_bytes="64MiB")
    a = Hybrid(kind, store, seed=35, **options)
    op_a, (kv_saved, side_saved) = a.backup()
    last = op_a.hash_value[-1]
    a.backend._store.flush()
    a.c.detach_storage_backend()
    state = side_saved[last]
    probe = state[len(state) // 2:len(state) // 2 + 32]
    flipped = 0
    for path in glob.glob(os.path.join(store["path"], "**", "bucket-*.kvb"), recursive=True):
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(probe)
            while at >= 0:
                f.seek(at)
                f.write(bytes(x ^ 0xFF for x in probe))
                flipped += 1
                at = data.find(probe, at + 1)
    assert flipped == 1, "the state's bytes are on SSD once, in its group"
    b = Hybrid(kind, store, seed=36, **options)
    op = _read_with(b, lambda: None)
    assert op.completed_tokens == PAGES * PAGE
    loaded = _check_never_mixed(b, op, kv_saved, side_saved)
    assert last not in loaded


def test_a_state_group_evicted_between_exists_and_get_is_never_mixed(store):
    """Eviction pressure (a small memory tier, no SSD) after the hit query until the
    last page's group is gone: what the read reports loaded is whole, KV and state of
    one put."""
    opts = dict(memory_capacity_bytes="8MiB", ssd_capacity_bytes=0)
    a = Hybrid("mamba", store, seed=37, **opts)
    op_a, (kv_saved, side_saved) = a.backup()
    key = _group_key(a, op_a.hash_value[-1])

    def pressure():
        filler, n = bytes(len(a.backend._store.get(key))), 0
        while a.backend._store.is_exist(key) == 1 and n < 4096:
            a.backend._store.put("filler/%d" % n, filler)
            n += 1
        assert n < 4096, "nothing was evicted"

    op = _read_with(a, pressure)
    assert op_a.hash_value[-1] not in _check_never_mixed(a, op, kv_saved, side_saved)


def test_two_groups_of_one_page_with_other_kv_bytes_are_both_misses(store):
    """Two trailing pools (SWA and Mamba) each keep a group of the prefix's last page:
    both are loaded when they hold the same KV bytes; when one was put with other KV
    bytes, neither state is loaded (either would sit beside a KV of another put)."""
    h = Hybrid("swa", store, seed=38)
    h.backend.register_mem_host_pool_v2(h.side, PoolName.MAMBA)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    kv_slots = h.kv.alloc(PAGES * PAGE)
    swa, mamba = h.side.alloc(2 * PAGE), h.side.alloc(PAGE)
    put = [PoolTransfer(name=PoolName.SWA, host_indices=swa, keys=hashes[-2:],
                        hit_policy=PoolHitPolicy.TRAILING_PAGES),
           PoolTransfer(name=PoolName.MAMBA, host_indices=mamba, keys=hashes[-1:],
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    assert h.backend.batch_set_v2(put) == {PoolName.SWA: [True] * 2, PoolName.MAMBA: [True]}
    assert all(h.backend.batch_set_v1(hashes, kv_slots))
    r = h.backend.batch_exists_v2(hashes, put)
    assert r.kv_hit_pages == PAGES

    def read():
        slots = h.kv.alloc(PAGES * PAGE)
        assert all(h.backend.batch_get_v1(hashes, slots))
        return h.backend.batch_get_v2([
            PoolTransfer(name=PoolName.SWA, host_indices=h.side.alloc(2 * PAGE),
                         keys=hashes[-2:]),
            PoolTransfer(name=PoolName.MAMBA, host_indices=h.side.alloc(PAGE),
                         keys=hashes[-1:])])

    assert read() == {PoolName.SWA: [True, True], PoolName.MAMBA: [True]}
    key = _group_key(h, hashes[-1], PoolName.MAMBA.value)
    value = bytearray(h.backend._store.get(key))
    value[0] ^= 0xFF  # the KV part
    assert h.backend._store.remove(key) >= 0 and h.backend._store.put(key, bytes(value)) == 0
    assert read() == {PoolName.SWA: [True, False], PoolName.MAMBA: [False]}


def test_a_failed_kv_backup_puts_none_of_its_groups(store):
    """batch_set_v2 leaves its groups for the batch_set_v1 that follows; when that
    fails, SGLang ends the backup, and a later batch_set_v1 of the same pages (another
    backup, whose state slots are others) does not put them with stale slots."""
    h = Hybrid("mamba", store, seed=39)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    t = PoolTransfer(name=PoolName.MAMBA, host_indices=h.side.alloc(1), keys=hashes[-1:],
                     hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert h.backend.batch_set_v2([t]) == {PoolName.MAMBA: [True]}
    assert h.backend.batch_set_v1(hashes, torch.arange(5)) == [False] * PAGES
    assert all(h.backend.batch_set_v1(hashes, h.kv.alloc(PAGES * PAGE)))
    assert h.backend._store.is_exist(_group_key(h, hashes[-1])) == 0
    assert h.backend.batch_exists_v2(hashes, [t]).kv_hit_pages == 0


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_sigkill_mid_backup_never_leaves_a_half_state_group(db_path, policy):
    """Crash rounds: a process backs up prefixes with their Mamba state (SGLang's steps,
    a new version of every byte each time, groups removed and put again) and is
    SIGKILLed at a random moment; after each kill every group reads absent or whole, its
    KV page and its state of one put, and a prefetch through SGLang's steps loads a
    state only beside the KV bytes of its own put."""
    import multiprocessing
    import random
    import signal
    import time

    import sglang_hybrid as sh
    from spawned import Spawned

    ctx = multiprocessing.get_context("spawn")
    rounds = max(2, int(os.environ.get("KV_CRASH_ROUNDS", "8")) // 4)
    rng = random.Random(48)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    whole = absent = states_loaded = 0
    # Where a kill lands is chance: on a slow machine a few rounds can end with no prefix
    # whole up to a state, so rounds go on (up to 4x) until one has loaded a state.
    r = 0
    while r < rounds or (states_loaded == 0 and r < 4 * rounds):
        r += 1
        writer = Spawned(ctx, sh.crash_writer, db_path, policy, 100 + r)
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(writer.process.pid, signal.SIGKILL)
        writer.process.join()
        h = Hybrid("mamba", {"path": db_path}, 7, offload_policy=policy, **sh.CRASH_OPTIONS)
        db = h.backend._store
        state_bytes = sum(h.side.get_page_buffer_meta(torch.arange(1))[1])
        for k in range(1, PAGES + 1):
            value = db.get(_group_key(h, hashes[k - 1]))
            if not value:  # absent: neither its KV page nor its state
                assert db.is_exist(_group_key(h, hashes[k - 1])) == 0, (r, k)
                absent += 1
                continue
            assert len(value) == h.backend._page_bytes + state_bytes, (r, k)
            assert value == value[:8] * (len(value) // 8), \
                "round %d: the group of page %d holds bytes of two puts" % (r, k - 1)
            whole += 1
            # Through SGLang's steps: a state loaded sits beside its own put's KV page.
            op = _read_with(h, lambda: None, tokens=TOKENS[:k * PAGE]) \
                if h.backend.batch_exists_v2(hashes[:k], h.transfers(hashes[:k])) \
                .kv_hit_pages == k else None
            if op is not None and op.pool_storage_result.extra_pool_hit_pages.get(
                    PoolName.MAMBA, 0):
                t = op.pool_transfers[0]
                state = _side_bytes(h.side, int(t.host_indices[0]))
                kv = _bytes(h.kv.get_data_page(int(op.host_indices[-PAGE])))
                assert kv[:8] == state[:8] == value[:8], (r, k)
                states_loaded += 1
            if op is not None:
                h.kv.free(op.host_indices)
                h.side.free(op.pool_transfers[0].host_indices)
        h.c.detach_storage_backend()
    assert whole > 0 and states_loaded > 0, (whole, absent, states_loaded)
    print("state group crash rounds: %d, groups whole %d, absent %d, half 0" % (
        r, whole, absent))


def test_reads_that_end_at_a_miss_leave_a_bounded_table(store, monkeypatch):
    """batch_get_v1 remembers the KV slots of its pages for the batch_get_v2 after it;
    a prefetch that stops at a KV miss calls no batch_get_v2, and the table keeps only
    the latest pages."""
    import kvengine.sglang.storage as st

    monkeypatch.setattr(st, "_LOADED_MAX", 4)
    h = Hybrid("mamba", store, seed=40)
    op, _ = h.backup()
    slots = h.kv.alloc(PAGES * PAGE)
    assert all(h.backend.batch_get_v1(op.hash_value, slots))
    assert list(h.backend._loaded.pages) == op.hash_value[-4:]
    # The state of the last page still pairs with the KV slot the last read gave it.
    t = PoolTransfer(name=PoolName.MAMBA, host_indices=h.side.alloc(1),
                     keys=op.hash_value[-1:])
    assert h.backend.batch_get_v2([t]) == {PoolName.MAMBA: [True]}
    assert h.backend._loaded.pages == {}


# ---------------------------------------------------------------- the copy path's groups

@pytest.mark.parametrize("kind", ["mamba", "swa"])
def test_the_copy_path_stores_a_state_as_one_value_with_its_flat_kv_page(store, kind):
    """Without interface_v1 SGLang backs the KV up through batch_set of flat pages: the
    trailing state is put in that call as a group with the page's flat value (one key,
    "flat-<layout>+<pool>:"), never under a key of its own; the round trip is bit-exact."""
    a = Hybrid(kind, store, seed=60, interface_v1=0)
    op, (kv_saved, side_saved) = a.backup()
    assert op.completed_tokens == PAGES * PAGE
    db = a.backend._store
    trailing = op.pool_transfers[0].keys
    for h in op.hash_value:
        if h in trailing:
            assert db.get(_group_key(a, h)) == kv_saved[h] + side_saved[h]
        else:
            assert db.is_exist(_group_key(a, h)) == 0
        assert db.is_exist(a.backend._keys.flat(h)) == 1
    assert "@flat-page_first+%s:" % kind in _group_key(a, trailing[0])
    side = a.backend._side_pools[op.pool_transfers[0].name.value]
    assert all(r == 0 for r in db.batch_is_exist(side.keys(op.hash_value)))
    b = Hybrid(kind, store, seed=61, interface_v1=0)
    result, (kv_loaded, side_loaded) = b.prefetch()
    assert result.completed_tokens == PAGES * PAGE
    assert kv_loaded == kv_saved and side_loaded == side_saved
    # Between batch_get and batch_get_v2 the backend holds only the flat pages a state
    # may pair with (the window), not every page read.
    assert b.backend.batch_get(op.hash_value, None)[0] is not None
    assert list(b.backend._loaded.flat) == trailing


def _remove(h, key):
    assert h.backend._store.remove(key) >= 0


def _rewrite(h, key):
    """The group put again by another put of the page: other KV bytes, another state."""
    value = h.backend._store.get(key)
    _remove(h, key)
    assert h.backend._store.put(key, bytes(x ^ 0x5A for x in value)) == 0


def _evict(h, key):
    filler, n = bytes(len(h.backend._store.get(key))), 0
    while h.backend._store.is_exist(key) == 1 and n < 4096:
        h.backend._store.put("filler/%d" % n, filler)
        n += 1
    assert n < 4096, "nothing was evicted"


@pytest.mark.parametrize("kind", ["mamba", "swa"])
@pytest.mark.parametrize("between", ["remove", "rewrite", "evict"])
def test_the_copy_paths_group_changed_between_exists_and_get_is_never_mixed(store, kind,
                                                                           between):
    """Copy path: the last page's group removed, put again with other bytes, or evicted
    after the hit query.  Its state is not reported loaded and its slot is untouched:
    SGLang has copied the flat KV page to a slot this backend is not told, so a group
    whose KV part is not the page read is a miss, never a state beside another put's
    KV (a group put again was read whole, so its state's bytes reached the slot SGLang
    then frees, reported not loaded).  Every page and state reported loaded is the
    writer's."""
    opts = dict(memory_capacity_bytes="8MiB", ssd_capacity_bytes=0) \
        if between == "evict" else {}
    a = Hybrid(kind, store, seed=62, interface_v1=0, **opts)
    op_a, (kv_saved, side_saved) = a.backup()
    last = op_a.hash_value[-1]
    key = _group_key(a, last)
    change = {"remove": _remove, "rewrite": _rewrite, "evict": _evict}[between]
    op = _read_with(a, lambda: change(a, key))
    if between == "evict" and op.completed_tokens < PAGES * PAGE:
        return  # the pressure took a KV page too: SGLang reads no state then
    assert op.completed_tokens == PAGES * PAGE
    loaded = _check_never_mixed(a, op, kv_saved, side_saved)
    assert last not in loaded
    t = op.pool_transfers[0]
    if between != "evict":  # the pressure may take the window's other group too
        assert op.pool_storage_result.extra_pool_hit_pages.get(t.name, 0) == \
            len(t.keys) - 1
    slot = int(t.host_indices[(len(t.keys) - 1) * a.side.page_size])
    if between != "rewrite":
        assert not any(_side_bytes(a.side, slot))


def test_the_copy_paths_failed_kv_backup_puts_none_of_its_groups(store):
    """A batch_set that fails (SGLang ends the backup) drops the groups batch_set_v2
    left: a later batch_set of the same pages does not put them."""
    h = Hybrid("mamba", store, seed=63, interface_v1=0)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    t = PoolTransfer(name=PoolName.MAMBA, host_indices=h.side.alloc(1), keys=hashes[-1:],
                     hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert h.backend.batch_set_v2([t]) == {PoolName.MAMBA: [True]}
    assert h.backend.batch_set(hashes, [None] * PAGES) is False  # not tensors: fails
    slots = h.kv.alloc(PAGES * PAGE)
    assert h.backend.batch_set(hashes, [h.kv.get_data_page(int(slots[i * PAGE]))
                                        for i in range(PAGES)])
    assert h.backend._store.is_exist(_group_key(h, hashes[-1])) == 0
    assert h.backend.batch_exists_v2(hashes, [t]).kv_hit_pages == 0


# ---------------------------------------------------------------- the draft pools' groups

def test_the_draft_kv_travels_in_the_kv_pages_group(store):
    """SGLang's draft sidecar (draft: indices_from_pool == KV, all_pages) is laid in the
    KV page's value after the indexer: one key per page holds the KV, the indexer and
    the draft page; a group removed between exists and get is a miss of all three."""
    a = Hybrid("dsa", store, seed=64)
    draft_dev, draft = fk.make_pools("mla", "page_first", torch.bfloat16, layers=1,
                                     page_size=PAGE, pages=PAGES * 4)
    fk.fill_random(draft, 640)
    a.backend.register_mem_host_pool_v2(draft, PoolName.DRAFT)
    assert "+indexer:" in a.backend._keys.prefix and "+draft:" in a.backend._keys.prefix
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = a.kv.alloc(PAGES * PAGE)

    def sidecars(host_indices):
        return [PoolTransfer(name=n, host_indices=host_indices, keys=hashes,
                             indices_from_pool=PoolName.KV)
                for n in (PoolName.INDEXER, PoolName.DRAFT)]

    r = a.backend.batch_set_v2(sidecars(slots))
    assert r == {PoolName.INDEXER: [True] * PAGES, PoolName.DRAFT: [True] * PAGES}
    assert all(a.backend.batch_set_v1(hashes, slots))
    first = int(slots[0])
    assert a.backend._store.get(_grouped_keys(a, hashes)[0]) == \
        _bytes(a.kv.get_data_page(first)) + _side_bytes(a.side, first) + \
        _bytes(draft.get_data_page(first))
    # Read into other slots: all three pools, bit-exact.
    other = a.kv.alloc(PAGES * PAGE)
    saved = [_bytes(draft.get_data_page(int(slots[i * PAGE]))) for i in range(PAGES)]
    draft.kv_buffer.zero_()
    assert all(a.backend.batch_get_v1(hashes, other))
    assert all(all(v) for v in a.backend.batch_get_v2(sidecars(other)).values())
    for i in range(PAGES):
        assert _bytes(draft.get_data_page(int(other[i * PAGE]))) == saved[i], i
    # A group put again by another put after the hit query: the read brings its KV,
    # indexer and draft pages, all three of that put.
    r = a.backend.batch_exists_v2(hashes, sidecars(None))
    assert r.kv_hit_pages == PAGES
    key = _grouped_keys(a, hashes)[2]
    _rewrite(a, key)
    new = a.backend._store.get(key)
    third = a.kv.alloc(PAGES * PAGE)
    assert all(a.backend.batch_get_v1(hashes, third))
    assert all(all(v) for v in a.backend.batch_get_v2(sidecars(third)).values())
    s2 = int(third[2 * PAGE])
    assert _bytes(a.kv.get_data_page(s2)) + _side_bytes(a.side, s2) + \
        _bytes(draft.get_data_page(s2)) == new
    # A group removed after the hit query: the page is a miss whole.
    _remove(a, key)
    ok = a.backend.batch_get_v1(hashes, a.kv.alloc(PAGES * PAGE))
    assert ok == [True, True, False, True, True, True]


def test_the_draft_swa_window_is_grouped_with_its_kv_page(store):
    """draft_swa (indices and keys from the SWA transfer, trailing_pages) is a trailing
    group of its own with the page's KV: removed between exists and get, it is a miss
    while the target's window loads; never a draft window without its KV page."""
    h = Hybrid("swa", store, seed=65)
    _, draft = fk.make_pools("mha", "page_first", torch.bfloat16, layers=1, heads=1,
                             head_dim=16, page_size=PAGE, pages=PAGES * 4)
    fk.fill_random(draft, 650)
    h.backend.register_mem_host_pool_v2(draft, PoolName.DRAFT_SWA)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    kv_slots, swa = h.kv.alloc(PAGES * PAGE), h.side.alloc(2 * PAGE)

    def window(slots):
        return [PoolTransfer(name=PoolName.SWA, host_indices=slots, keys=hashes[-2:],
                             hit_policy=PoolHitPolicy.TRAILING_PAGES),
                PoolTransfer(name=PoolName.DRAFT_SWA, host_indices=slots, keys=hashes[-2:],
                             hit_policy=PoolHitPolicy.TRAILING_PAGES,
                             indices_from_pool=PoolName.SWA)]

    assert all(all(v) for v in h.backend.batch_set_v2(window(swa)).values())
    assert all(h.backend.batch_set_v1(hashes, kv_slots))
    db = h.backend._store
    key = _group_key(h, hashes[-1], PoolName.DRAFT_SWA.value)
    assert "+draft_swa:" in key
    first = int(swa[PAGE])
    assert db.get(key) == _bytes(h.kv.get_data_page(int(kv_slots[-PAGE]))) + \
        _side_bytes(draft, first)
    side = h.backend._side_pools[PoolName.DRAFT_SWA.value]
    assert all(r == 0 for r in db.batch_is_exist(side.keys(hashes)))
    assert h.backend.batch_exists_v2(hashes, window(None)).kv_hit_pages == PAGES
    _remove(h, key)
    assert h.backend.batch_exists_v2(hashes, window(None)).kv_hit_pages == 0
    assert all(h.backend.batch_get_v1(hashes, h.kv.alloc(PAGES * PAGE)))
    r = h.backend.batch_get_v2(window(h.side.alloc(2 * PAGE)))
    assert r == {PoolName.SWA: [True, True], PoolName.DRAFT_SWA: [True, False]}


# ---------------------------------------------------------------- MLA ranks but 0

def test_an_mla_rank_that_writes_no_kv_reads_a_missing_state_as_a_miss(store):
    """MLA + Mamba (Kimi Linear): the KV is rank 0's, written by rank 0 alone (SGLang's
    backup_skip), the Mamba state is each rank's own slice, backed up by every rank in
    batch_set_v2 with the state's host slots only.  Rank 1 is never told a KV slot, so
    its state is a value of its own (docs/sglang.md, "Where a page has no group"); a
    state removed between exists and get is reported not loaded and its slot stays as
    it was -- SGLang then takes the least of every rank's count and drops the prefetch
    whole (all-or-nothing for trailing pools)."""
    r0 = Hybrid("mla_mamba", store, seed=66, rank=0, tp_size=2)
    op0, (kv_saved, side0) = r0.backup()
    r1 = Hybrid("mla_mamba", store, seed=67, rank=1, tp_size=2)
    op1, (_, side1) = r1.backup()
    assert op1.completed_tokens == PAGES * PAGE  # the state alone, as SGLang counts it
    last = op0.hash_value[-1]
    assert r1.backend._side_pools[PoolName.MAMBA.value].member is None
    assert r0.backend._side_pools[PoolName.MAMBA.value].member is not None
    state_key = r1.backend._side_pools[PoolName.MAMBA.value].keys([last])[0]
    assert r1.backend._store.is_exist(state_key) == 1
    op = _read_with(r1, lambda: None)
    assert _check_never_mixed(r1, op, kv_saved, side1) == [last]
    op = _read_with(r1, lambda: _remove(r1, state_key))
    assert op.completed_tokens == PAGES * PAGE
    assert op.pool_storage_result.extra_pool_hit_pages.get(PoolName.MAMBA, 0) == 0
    assert not any(_side_bytes(r1.side, int(op.pool_transfers[0].host_indices[0])))


def test_a_grouped_pool_registered_again_counts_once(store):
    """register_mem_host_pool_v2 of the indexer a second time (SGLang's attach after a
    detach re-registers its entries) replaces it: the page group's bytes and key are as
    after the first, and a round trip still reads every page whole."""
    a = Hybrid("dsa", store, seed=68)
    before = (a.backend._page_bytes, a.backend._keys.prefix)
    a.backend.register_mem_host_pool_v2(a.side, PoolName.INDEXER)
    assert (a.backend._page_bytes, a.backend._keys.prefix) == before
    op, (kv_saved, _) = a.backup()
    assert op.completed_tokens == PAGES * PAGE
    result, (kv_loaded, _) = Hybrid("dsa", store, seed=69).prefetch()
    assert result.completed_tokens == PAGES * PAGE and kv_loaded == kv_saved
