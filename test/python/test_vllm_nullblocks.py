"""vLLM's null block in a hybrid model's groups (docs/vllm.md, "Hybrid models").

A sliding-window (or Mamba) group holds vLLM's null block, block 0, at the positions it
skips; its bytes are everyone's garbage.  The connector never saves them under a
request's key, never loads into block 0, and counts a position whose group had no saved
bytes as a hit only for a request that skips it in that group too."""
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

from kvengine.vllm._vllm_compat import KVConnectorRole  # noqa: E402
from kvengine.vllm.connector import KVEngineConnector  # noqa: E402
from kvengine.vllm.nullblocks import GroupSkips  # noqa: E402
import vllm_fakes as fk  # noqa: E402
from test_vllm_connector import Instance, prompt, same_bytes  # noqa: E402

BS = 16
LAYOUT = "flash_nhd"
NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(3)]
# Layers 0 and 1 full attention, layer 2 a sliding window of 2 blocks and a token: a
# request with M computed tokens skips its first (M - 2 * BS) // BS positions there.
SPECS = [fk.FullAttentionSpec(block_size=BS, num_kv_heads=4, head_size=8, dtype=torch.float16),
         fk.SlidingWindowSpec(block_size=BS, num_kv_heads=4, head_size=8, dtype=torch.float16,
                              sliding_window=2 * BS + 1)]
SW_LAYER = 2


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


@pytest.fixture
def store_path(db_path):
    return db_path


def hybrid_config():
    return fk.KVCacheConfig(16, [], [fk.KVCacheGroupSpec(NAMES[:2], SPECS[0]),
                                     fk.KVCacheGroupSpec(NAMES[2:], SPECS[1])])


def garbage_in_null_block(inst):
    """What some other request left in block 0: never anyone's KV."""
    for cache in inst.caches.values():
        fk.block_view(cache, LAYOUT, 0).fill_(7.5)
    return inst.block(0)


def key_present(inst, block_hash, layer):
    return inst.worker._db.is_exist(inst.worker.block_key(block_hash.hex(), layer=layer)) == 1


def save_with_null_window(a, req):
    """req's 6 blocks saved on `a` while its sliding-window group holds the null block at
    positions 0 and 1: its first 4 blocks were a local prefix-cache hit (vLLM pads the
    skipped positions of a new request with the null block), the last 2 computed now."""
    local = 4 * BS
    full_ids, window_ids = list(range(1, 7)), list(range(9, 15))
    ids = fk.hybrid_block_ids(SPECS, (full_ids, window_ids), local, BS)
    assert ids == (full_ids, [0, 0, 11, 12, 13, 14])
    for pos in range(4):  # the locally cached blocks' KV, in both groups' blocks
        fk.fill_block(a.caches, LAYOUT, full_ids[pos], req.block_hashes[pos])
        fk.fill_block(a.caches, LAYOUT, window_ids[pos], req.block_hashes[pos])
    assert a.sched.get_num_new_matched_tokens(req, local) == (0, False)
    a.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), 0)
    out = fk.new_step(new=[(req, ids, local, req.num_tokens - local)])
    meta = a.sched.build_connector_meta(out)
    assert meta.saves[0].block_ids == [full_ids, [0, 0, 11, 12, 13, 14]]
    compute = [(b, req.block_hashes[p]) for p in (4, 5) for b in (full_ids[p], window_ids[p])]
    fk.run_worker_step(a.worker, meta, a.caches, LAYOUT, compute=compute)
    return full_ids, window_ids


def test_a_null_block_is_never_saved(store_path):
    """Fails before the null-block handling: block 0's garbage was saved under the
    request's keys of the sliding-window layer at positions 0 and 1."""
    a = Instance(store_path, LAYOUT, kv_cache_config=hybrid_config())
    try:
        garbage_in_null_block(a)
        req = a.request("r1", prompt(6 * BS, seed=31))
        save_with_null_window(a, req)
        for pos, h in enumerate(req.block_hashes):
            assert key_present(a, h, 0) and key_present(a, h, 1)
            assert key_present(a, h, SW_LAYER) == (pos >= 2), pos
    finally:
        a.close()


@pytest.mark.parametrize("staged", [False, True])
def test_a_later_request_loads_only_what_it_needs_and_never_into_block_0(store_path, staged):
    a = Instance(store_path, LAYOUT, kv_cache_config=hybrid_config())
    b = Instance(store_path, LAYOUT, kv_cache_config=hybrid_config(), force_staging=staged)
    try:
        req = a.request("r1", prompt(6 * BS, seed=37))
        full_a, window_a = save_with_null_window(a, req)
        null_b = garbage_in_null_block(b)

        # 6 blocks and a token: loaded, it skips positions 0-3 of the window, whose keys
        # the store lacks, and needs 4 and 5, which it has: a hit of every block.
        req_b = b.request("r2", prompt(6 * BS + 1, seed=37))
        matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        assert matched == 6 * BS
        full_b, window_b = list(range(1, 8)), list(range(8, 15))
        ids = fk.hybrid_block_ids(SPECS, (full_b, window_b), matched, BS)
        assert ids[1][:5] == [0, 0, 0, 0, 12]
        b.sched.update_state_after_alloc(req_b, fk.KVCacheBlocks(ids), matched)
        out = fk.new_step(new=[(req_b, ids, matched, 1)])
        meta = b.sched.build_connector_meta(out)
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for got, want in zip(b.block(0), null_b):  # the null block is untouched
            assert same_bytes(got, want)
        for pos in range(6):
            got, want = b.block(full_b[pos]), a.block(full_a[pos])
            assert same_bytes(got[0], want[0]) and same_bytes(got[1], want[1])
        for pos in (4, 5):
            assert same_bytes(b.block(window_b[pos])[2], a.block(window_a[pos])[2])

        # Shorter prompts need a window position saved as null: no hit there.  With 4
        # blocks and a token the window is positions 2-3 (saved): a hit of 4 blocks.  With 3
        # and a token it is 1-2, and position 1 has no bytes: a miss, and a shorter run
        # needs 0 or 1 as well.  With exactly 4 blocks vLLM recomputes the last token: 63
        # tokens computed put the window at 1-3 -- a miss too.
        cases = [(4 * BS + 1, 4 * BS), (3 * BS + 1, 0), (4 * BS, 0)]
        for i, (n, want) in enumerate(cases):
            got, _ = b.sched.get_num_new_matched_tokens(b.request("s%d" % i, prompt(n, seed=37)),
                                                        0)
            assert got == want, (n, got)
    finally:
        a.close()
        b.close()


def test_a_failed_position_never_reports_the_null_block(store_path):
    """A load failure fails the position's blocks in every group -- but block 0, where its
    window group holds the null block: vLLM would take it for one of the request's."""
    a = Instance(store_path, LAYOUT, kv_cache_config=hybrid_config())
    b = Instance(store_path, LAYOUT, kv_cache_config=hybrid_config())
    try:
        req = a.request("r1", prompt(6 * BS, seed=41))
        save_with_null_window(a, req)
        null_b = garbage_in_null_block(b)
        req_b = b.request("r2", prompt(6 * BS + 1, seed=41))
        matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        assert matched == 6 * BS
        ids = fk.hybrid_block_ids(SPECS, (list(range(1, 8)), list(range(8, 15))), matched, BS)
        b.sched.update_state_after_alloc(req_b, fk.KVCacheBlocks(ids), matched)
        meta = b.sched.build_connector_meta(fk.new_step(new=[(req_b, ids, matched, 1)]))
        # Between the match and the load, a full-attention layer of position 1 goes.
        assert a.worker._db.remove(a.worker.block_key(req.block_hashes[1].hex(), layer=0)) == 0
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == {2}
        for got, want in zip(b.block(0), null_b):
            assert same_bytes(got, want)
    finally:
        a.close()
        b.close()


def test_group_skips_follow_vllms_managers():
    """GroupSkips.skipped_blocks is get_num_skipped_tokens // block_size of each group's
    manager (vLLM main), and usable() a run whose missing keys all lie in skipped
    positions: a Mamba group needs only the position of its last computed token."""
    mamba = fk.MambaSpec(block_size=BS, shapes=((4,),), dtypes=(torch.float16,),
                         mamba_cache_mode="align")
    chunked = fk.ChunkedLocalAttentionSpec(block_size=BS, num_kv_heads=4, head_size=8,
                                           dtype=torch.float16, attention_chunk_size=2 * BS)
    kcc = fk.KVCacheConfig(16, [], [fk.KVCacheGroupSpec(["a"], SPECS[0]),
                                    fk.KVCacheGroupSpec(["b"], SPECS[1]),
                                    fk.KVCacheGroupSpec(["c"], mamba),
                                    fk.KVCacheGroupSpec(["d"], chunked)])
    skips = GroupSkips(kcc, BS)
    assert [skips.has_nulls(g) for g in range(5)] == [False, True, True, True, False]
    assert skips.is_null(1, 0) and not skips.is_null(0, 0) and not skips.is_null(1, 3)
    for m in (0, 1, 16, 33, 48, 64, 100):
        for g in range(4):
            want = max(0, fk.skipped_tokens(kcc.kv_cache_groups[g].kv_cache_spec, m)) // BS
            assert skips.skipped_blocks(g, m) == want
    # Mamba state saved at positions 1 and 3 only (the ends of two prefill chunks).
    missing = [{2}, set(), {2}, set()]
    assert skips.usable(0, missing, lambda h: h * BS) == [True, False, True, False, True]
    # A full-attention position missing ends every run through it.
    assert skips.usable(0, [set(), {0}, set()], lambda h: h * BS) == [True, True, False, False]


def test_a_deferred_save_never_reads_a_block_the_window_left(store_path):
    """A running request's cached data carries only its new block ids, but vLLM nulled and
    freed its window blocks outside the window as the step was scheduled
    (remove_skipped_blocks): a save held back until then (num_publishable_block_hashes)
    skips them instead of reading a block that may be another request's by now."""
    a = Instance(store_path, LAYOUT, kv_cache_config=hybrid_config())
    try:
        req = a.request("r1", prompt(6 * BS, seed=43))
        full_ids, window_ids = list(range(1, 7)), list(range(9, 15))
        a.sched.get_num_new_matched_tokens(req, 0)
        a.sched.update_state_after_alloc(req, fk.KVCacheBlocks((full_ids[:4], window_ids[:4])),
                                         0)
        req.num_publishable_block_hashes = 1  # vLLM: the rest may still change
        out = fk.new_step(new=[(req, (full_ids[:4], window_ids[:4]), 0, 4 * BS)])
        compute = [(b, req.block_hashes[p]) for p in range(4) for b in (full_ids[p],
                                                                         window_ids[p])]
        fk.run_worker_step(a.worker, a.sched.build_connector_meta(out), a.caches, LAYOUT,
                           compute=compute)
        # The next step: 64 tokens computed, so positions 0 and 1 of the window group are
        # the null block now, and block 10 is another request's.
        fk.fill_block(a.caches, LAYOUT, window_ids[1], b"another request")
        req.num_publishable_block_hashes = 6
        out = fk.cached_step([req.request_id], [(full_ids[4:], window_ids[4:])], [4 * BS],
                             [2 * BS])
        meta = a.sched.build_connector_meta(out)
        assert meta.saves[0].block_ids == [full_ids[1:], [0, 11, 12, 13, 14]]
        compute = [(b, req.block_hashes[p]) for p in (4, 5) for b in (full_ids[p],
                                                                       window_ids[p])]
        fk.run_worker_step(a.worker, meta, a.caches, LAYOUT, compute=compute)
        for pos, h in enumerate(req.block_hashes):
            assert key_present(a, h, 0), pos
            assert key_present(a, h, SW_LAYER) == (pos != 1), pos
    finally:
        a.close()


def _hybrid_instance(inst, path, specs, layer2_cache, **extra):
    """Sets up inst (an Instance) with layers 0-1 in a group of specs[0] and layer 2, its
    cache layer2_cache, in a group of specs[1]."""
    cfg = fk.make_config(path, block_size=BS, **extra)
    kcc = fk.KVCacheConfig(16, [], [fk.KVCacheGroupSpec(NAMES[:2], specs[0]),
                                    fk.KVCacheGroupSpec(NAMES[2:], specs[1])])
    inst.layout = LAYOUT
    inst.none_hash = fk.init_none_hash()
    inst.sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER, kcc)
    inst.worker = KVEngineConnector(cfg, KVConnectorRole.WORKER, kcc)
    inst.caches = fk.make_caches(LAYOUT, block_size=BS)
    inst.caches[NAMES[2]] = layer2_cache
    inst.worker.register_kv_caches(inst.caches)


ALIGN = fk.MambaSpec(block_size=BS, shapes=((2, 8), (4,)),
                     dtypes=(torch.float32, torch.float16), mamba_cache_mode="align",
                     num_speculative_blocks=2)


class MambaInstance(Instance):
    """An instance whose layer 2 is a Mamba layer ("align" mode, two speculative blocks):
    its cache is the state tensors vLLM hands a connector for it."""

    def __init__(self, path, **extra):
        _hybrid_instance(self, path, (SPECS[0], ALIGN), fk.make_state_cache(ALIGN), **extra)


def _layer_bytes(inst, block_id, layer):
    """The block's bytes in one layer as the connector stores them (memory order)."""
    import ctypes

    ptrs, lens = inst.worker.connector_worker._layers[layer].parts(block_id)
    return b"".join(ctypes.string_at(p, n) for p, n in zip(ptrs, lens))


def test_mamba_align_mode_never_saves_a_moved_speculative_block(store_path):
    """vLLM's Mamba "align" mode with speculative blocks (MambaManager, the stand-in
    member for member as on vLLM main): each step the previous step's speculative blocks
    are reused, and one that falls inside the skipped positions is moved to the end of
    the request's list with the null block left in its place -- but the cached-request
    data names only the ids appended.  The connector must not keep the block at its old
    position: a save of that position would store a speculative state (a later
    position's) as its state.  Fails before: position 2 was saved from block s1 after
    vLLM had moved s1 to the end, and position 4 likewise a step later.  Layer 2 is a
    Mamba layer as vLLM hands it (a list of state tensors, fk.make_state_cache; before,
    the worker refused it), and another instance loads the last position's state
    bit-exact."""
    mamba = ALIGN
    a = MambaInstance(store_path)
    b = MambaInstance(store_path)
    try:
        manager = fk.MambaManager(mamba, fk.BlockPool(10, True, BS))
        req = a.request("r1", prompt(6 * BS, seed=47))
        assert a.sched.get_num_new_matched_tokens(req, 0) == (0, False)
        full = list(range(10, 16))
        states = {}  # position -> the bytes of its state, as vLLM's list holds it
        for step in range(3):
            computed, new_tokens = 2 * BS * step, 2 * BS  # chunks aligned to blocks
            manager.remove_skipped_blocks(req.request_id, computed)
            new_mamba = manager.allocate_new_blocks(req.request_id, computed + new_tokens,
                                                    computed + new_tokens)
            held = manager.req_to_blocks[req.request_id]
            new_full = full[2 * step:2 * step + 2]
            if step == 0:
                ids = (new_full, list(held))
                a.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), 0)
                out = fk.new_step(new=[(req, ids, 0, new_tokens)])
            else:
                out = fk.cached_step([req.request_id], [(new_full, new_mamba)], [computed],
                                     [new_tokens])
            meta = a.sched.build_connector_meta(out)
            (save,) = meta.saves
            first = save.first_block
            # What the connector saves in the Mamba group is what vLLM holds there.
            assert save.block_ids[1] == held[first:first + 2], (step, held)
            # The forward: the running state after the chunk in the block before the
            # speculative ones; the speculative blocks hold what drafts left.
            running = len(held) - 1 - mamba.num_speculative_blocks
            compute = [(b, req.block_hashes[2 * step + i]) for i, b in enumerate(new_full)]
            compute += [(held[running], b"s%d state" % running)]
            compute += [(b, b"x%d%d spec" % (step, b)) for b in held[running + 1:]]
            fk.run_worker_step(a.worker, meta, a.caches, LAYOUT, compute=compute)
            states[running] = _layer_bytes(a, held[running], SW_LAYER)
        assert sorted(states) == [1, 3, 5]
        db = a.worker._db
        for pos, h in enumerate(req.block_hashes):
            key = a.worker.block_key(h.hex(), layer=SW_LAYER)
            if pos in states:
                assert db.get(key) == states[pos], pos
            else:
                assert db.is_exist(key) == 0, pos  # the null block there: never saved
        # Another instance's request of the same prompt and a token: the state of the
        # last position comes back bit-exact into its Mamba block; the skipped
        # positions (the null block) are neither loaded nor reported.
        req_b = b.request("r2", prompt(6 * BS + 1, seed=47))
        ids = fk.hybrid_block_ids((SPECS[0], mamba), (list(range(1, 8)), list(range(8, 15))),
                                  6 * BS, BS)
        meta = _match_and_load(b, req_b, ids, 6 * BS)
        assert meta.loads[0].block_ids[1] == [0, 0, 0, 0, 0, 13]
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == set()
        assert _layer_bytes(b, 13, SW_LAYER) == states[5]
        # The layer's part of the layout tag names its states' dtypes and shapes.
        assert "+Mf32s2x8_f16s4@" in b.worker.block_key(req.block_hashes[0].hex(),
                                                         layer=SW_LAYER)
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- groups of other block sizes

A = -1  # nullblocks.ABSENT: no block of the group ends at the position
BIG = [fk.FullAttentionSpec(block_size=BS, num_kv_heads=4, head_size=8, dtype=torch.float16),
       fk.FullAttentionSpec(block_size=2 * BS, num_kv_heads=4, head_size=8,
                            dtype=torch.float16)]


class SizedInstance(Instance):
    """An instance whose layer 2 is in a group of 2 * BS-token blocks (vLLM's hybrid
    allocator with per-group block sizes): its cache's blocks hold 32 tokens, and the
    request's block hashes are every BS tokens (the GCD of the sizes)."""

    def __init__(self, path, **extra):
        big = next(iter(fk.make_caches(LAYOUT, num_layers=1, block_size=2 * BS).values()))
        _hybrid_instance(self, path, BIG, big, **extra)


def _save_sized(a, req, small, big):
    assert a.sched.get_num_new_matched_tokens(req, 0) == (0, False)
    ids = (small, big)
    a.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), 0)
    meta = a.sched.build_connector_meta(fk.new_step(new=[(req, ids, 0, req.num_tokens)]))
    n = len(req.block_hashes)
    compute = [(small[p], req.block_hashes[p]) for p in range(n)]
    compute += [(big[j], req.block_hashes[2 * j + 1]) for j in range(n // 2)]
    fk.run_worker_step(a.worker, meta, a.caches, LAYOUT, compute=compute)
    return meta


def _match_and_load(b, req_b, ids, want):
    """b's scheduler matches req_b (want tokens) and allocates ids: the step's meta."""
    matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
    assert matched == want
    b.sched.update_state_after_alloc(req_b, fk.KVCacheBlocks(ids), matched)
    return b.sched.build_connector_meta(fk.new_step(new=[(req_b, ids, matched, 1)]))


def test_a_group_of_bigger_blocks_is_saved_once_per_block_under_its_last_position(
        store_path):
    """Layer 2's group has blocks of two positions: each is saved whole (32 tokens)
    under the key of the last position it covers, and the group has no key at the
    other positions.  Before: the connector refused the layer (no dim of 16 tokens)."""
    a = SizedInstance(store_path)
    try:
        assert a.worker.connector_worker._keys.block_size == BS
        req = a.request("r1", prompt(6 * BS, seed=53))
        small, big = list(range(1, 7)), [9, 10, 11]
        meta = _save_sized(a, req, small, big)
        assert meta.saves[0].block_ids == [small, [A, 9, A, 10, A, 11]]
        for pos, h in enumerate(req.block_hashes):
            assert key_present(a, h, 0) and key_present(a, h, 1)
            assert key_present(a, h, 2) == (pos % 2 == 1), pos
        value = a.worker._db.get(a.worker.block_key(req.block_hashes[3].hex(), layer=2))
        assert value == _layer_bytes(a, 10, 2) and len(value) == 2 * BS * 4 * 16 * 2
    finally:
        a.close()


def test_a_hit_is_the_blocks_whose_every_group_is_present(store_path):
    """The scheduler's hit ends where every group's block does (a multiple of 2
    positions, as vLLM's hits are multiples of the LCM of the block sizes), short of
    the last token, and only where every group has its keys; a load is bit-exact in
    both groups and never touches a position's blocks in one group alone."""
    a = SizedInstance(store_path)
    b = SizedInstance(store_path)
    try:
        req = a.request("r1", prompt(6 * BS, seed=59))
        _save_sized(a, req, list(range(1, 7)), [9, 10, 11])
        cases = [(6 * BS + 1, 6 * BS), (6 * BS, 4 * BS), (5 * BS + 1, 4 * BS),
                 (3 * BS, 2 * BS)]
        for i, (n, want) in enumerate(cases):
            got, _ = b.sched.get_num_new_matched_tokens(
                b.request("s%d" % i, prompt(n, seed=59)), 0)
            assert got == want, (n, got)
        # A whole load: 6 positions, the big group's three blocks.
        ids = (list(range(1, 8)), [12, 13, 14, 15])
        meta = _match_and_load(b, b.request("r2", prompt(6 * BS + 1, seed=59)), ids, 6 * BS)
        assert meta.loads[0].block_ids == [list(range(1, 7)), [A, 12, A, 13, A, 14]]
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for j, (mine, theirs) in enumerate(zip([12, 13, 14], [9, 10, 11])):
            assert _layer_bytes(b, mine, 2) == _layer_bytes(a, theirs, 2), j
        for p in range(6):
            assert _layer_bytes(b, p + 1, 0) == _layer_bytes(a, p + 1, 0), p
        # The big group's key of position 3 gone: the hit stops at 2 positions, not 3.
        key = a.worker.block_key(req.block_hashes[3].hex(), layer=2)
        assert a.worker._db.remove(key) == 0
        got, _ = b.sched.get_num_new_matched_tokens(b.request("s9", prompt(6 * BS + 1,
                                                                         seed=59)), 0)
        assert got == 2 * BS
    finally:
        a.close()
        b.close()


def test_a_failed_big_block_fails_every_position_it_covers(store_path):
    """The big group's block of positions 4-5 removed between the match and the load:
    positions 4 and 5 both fail, in both groups (the small group's block 5 loaded
    fine but its position is not whole), and nothing else."""
    a = SizedInstance(store_path)
    b = SizedInstance(store_path)
    try:
        req = a.request("r1", prompt(6 * BS, seed=61))
        _save_sized(a, req, list(range(1, 7)), [9, 10, 11])
        ids = (list(range(1, 8)), [12, 13, 14, 15])
        meta = _match_and_load(b, b.request("r2", prompt(6 * BS + 1, seed=61)), ids, 6 * BS)
        assert a.worker._db.remove(a.worker.block_key(req.block_hashes[5].hex(),
                                                      layer=2)) == 0
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == {5, 6, 14}
        # And a small group's key of position 4 gone: the big block 4-5 fails too.
        b2 = SizedInstance(store_path)
        try:
            assert a.worker.connector_worker._db.put(
                a.worker.block_key(req.block_hashes[5].hex(), layer=2),
                _layer_bytes(a, 11, 2)) == 0
            meta = _match_and_load(b2, b2.request("r3", prompt(6 * BS + 1, seed=61)), ids,
                                   6 * BS)
            assert a.worker._db.remove(a.worker.block_key(req.block_hashes[4].hex(),
                                                          layer=0)) == 0
            fk.run_worker_step(b2.worker, meta, b2.caches, LAYOUT)
            assert b2.worker.get_block_ids_with_load_errors() == {5, 6, 14}
        finally:
            b2.close()
    finally:
        a.close()
        b.close()


def test_the_hash_block_size_is_vllms():
    """nullblocks.hash_block_size follows vLLM main's resolve_kv_cache_block_sizes (with a
    connector): one group, the cache's block size; several, the GCD of their block sizes
    or the cache config's hash_block_size; their LCM where a Mamba group's block size is
    not the cache's; a ValueError where the override does not divide a group's."""
    from kvengine.vllm.nullblocks import hash_block_size

    def kcc(*specs):
        return fk.KVCacheConfig(16, [], [fk.KVCacheGroupSpec(["l%d" % i], s)
                                         for i, s in enumerate(specs)])

    def full(bs):
        return fk.FullAttentionSpec(block_size=bs, num_kv_heads=4, head_size=8,
                                    dtype=torch.float16)

    def mamba(bs, mode="none"):
        return fk.MambaSpec(block_size=bs, shapes=((4,),), dtypes=(torch.float16,),
                            mamba_cache_mode=mode)

    cache = fk.CacheConfig(block_size=16)
    assert hash_block_size(cache, None) == 16
    assert hash_block_size(cache, kcc(full(16))) == 16
    assert hash_block_size(cache, kcc(full(32), full(48))) == 16
    assert hash_block_size(cache, kcc(full(16), mamba(16, "align"))) == 16
    assert hash_block_size(cache, kcc(full(16), mamba(64))) == 64
    assert hash_block_size(fk.CacheConfig(block_size=16, hash_block_size=8),
                           kcc(full(16), full(32))) == 8
    with pytest.raises(ValueError):
        hash_block_size(fk.CacheConfig(block_size=16, hash_block_size=24),
                        kcc(full(16), full(32)))
    # Hashes every 64 tokens beside 16-token attention blocks: a position would be four
    # blocks of the attention group -- refused, naming the sizes.
    with pytest.raises(ValueError, match="not a multiple of the request's block hash"):
        GroupSkips(kcc(full(16), mamba(64)), hash_block_size(cache, kcc(full(16), mamba(64))))
    skips = GroupSkips(kcc(full(16), full(32)), 16)
    assert skips.alignment == 2 and not skips.uniform()
    assert skips.at_positions([[1, 2, 3, 4], [7, 8]], 1, 3) == [[2, 3, 4], [7, -1, 8]]
    # Only runs ending on an even position are usable; the big group's missing key at
    # position 3 ends every run through it, its absence at 2 (no key there) none.
    assert skips.usable(0, [set(), set(), {1}, {1}], lambda h: h * 16) == \
        [True, False, True, False, False]


def test_a_state_layer_is_read_as_vllm_lays_it_out():
    """analyse_state_layer: a Mamba layer's states, each block's side by side in its page
    (vLLM's _reshape_kv_cache_tensors), as segments of one block; a state whose block is
    not contiguous, or states of different block strides, are refused naming the layer."""
    from kvengine.vllm.layout import analyse_state_layer

    states = fk.make_state_cache(ALIGN, num_blocks=5)
    g = analyse_state_layer("m", states)
    assert (g.num_blocks, g.block_stride, g.segments, g.segment_sizes(), g.block_bytes) == \
        (5, 72, [0, 64], [64, 8], 72)
    assert g.tag == "Mf32s2x8_f16s4"
    with pytest.raises(ValueError, match="layer m2.*not contiguous"):
        analyse_state_layer("m2", [states[0].transpose(1, 2), states[1]])
    with pytest.raises(ValueError, match="layer m3.*differ"):
        analyse_state_layer("m3", [states[0], torch.zeros(5, 4, dtype=torch.float16)])
