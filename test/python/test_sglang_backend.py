"""kvengine.sglang.KVEngineHiCacheStorage in one process, through SGLang's factory and
cache-controller steps (the stand-in, sglang_fakes.py) over a real store: the copy
path, the failure contract, metrics, clear(), the extra config, and a vLLM block beside
an SGLang page in one store.  test_sglang_processes.py covers ranks and instances in
separate processes."""
import logging

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import kvengine  # noqa: E402
import sglang_fakes as fk  # noqa: E402
from kvengine.sglang import KVEngineHiCacheStorage
from kvengine.sglang._sglang_compat import HiCacheStorage, StorageMetrics
from kvengine.shared_store import default_socket

SMALL = dict(memory_capacity_bytes="64MiB", prefault_memory=False, apply_environment=False)
PAGE = 16


def controller(store, kind="mha", layout="page_first", dtype=torch.bfloat16, rank=0,
               tp_size=1, interface_v1=1, seed=1, metrics=False, **options):
    fk.set_parallel(rank, tp_size)
    dev, host = fk.make_pools(kind, layout, dtype, page_size=PAGE)
    fk.fill_random(host, seed)
    extra = fk.kvengine_extra_config(interface_v1=interface_v1, **store, **dict(SMALL, **options))
    return fk.make_controller(dev, host, extra, enable_storage_metrics=metrics), host


def backup(c, host, tokens, pages=None):
    hashes = fk.get_hash_str(tokens, None, PAGE)
    pages = range(len(hashes)) if pages is None else pages
    slots = host.alloc(len(pages) * PAGE)
    op = fk.StorageOperation(slots, tokens, hash_value=[hashes[p] for p in pages])
    c._page_backup(op)
    return op.completed_tokens, [fk.page_bytes(host, int(slots[i * PAGE]))
                                 for i in range(len(pages))]


def prefetch(c, host, tokens, skip_pages=2):
    """The prefetch thread's steps: hit query, then the transfer into fresh slots."""
    op = fk.PrefetchOperation("r", tokens)
    hashes, hit = c._storage_hit_query(op)
    host.alloc(skip_pages * PAGE)
    slots = host.alloc(len(hashes) * PAGE)
    op.hash_value, op.host_indices = hashes, slots
    c._page_transfer(op)
    return op.completed_tokens, [fk.page_bytes(host, int(slots[i * PAGE]))
                                 for i in range(op.completed_tokens // PAGE)]


TOKENS = list(range(3, 3 + 4 * PAGE + 5))  # 4 whole pages


def test_the_factory_loads_a_real_subclass_and_the_controller_picks_zero_copy(db_path):
    c, _ = controller({"path": db_path})
    assert isinstance(c.storage_backend, KVEngineHiCacheStorage)
    assert issubclass(KVEngineHiCacheStorage, HiCacheStorage)
    assert c.page_get_func == c._page_get_zero_copy
    assert c.page_set_func == c._page_set_zero_copy
    c.detach_storage_backend()
    c, _ = controller({"path": db_path}, interface_v1=0)
    assert c.page_get_func == c._generic_page_get
    c.detach_storage_backend()


@pytest.mark.parametrize("kind,layout", [("mha", "layer_first"), ("mha", "page_first"),
                                         ("mla", "layer_first"), ("mla", "page_first_direct")])
def test_the_copy_path_round_trips_flat_pages(db_path, kind, layout):
    """Without interface_v1 SGLang moves flat data pages (batch_set / batch_get)."""
    a, ha = controller({"path": db_path}, kind, layout, interface_v1=0, seed=5)
    b, hb = controller({"path": db_path}, kind, layout, interface_v1=0, seed=6)
    done, saved = backup(a, ha, TOKENS)
    assert done == 4 * PAGE
    loaded, pages = prefetch(b, hb, TOKENS)
    assert loaded == 4 * PAGE and pages == saved
    # The copy path's pages are not the zero-copy path's (their bytes lie differently).
    zero_copy, _ = controller({"path": db_path}, kind, layout)
    assert zero_copy.storage_backend.batch_exists(fk.get_hash_str(TOKENS, None, PAGE)) == 0
    for c in (a, b, zero_copy):
        c.detach_storage_backend()


def test_a_page_is_written_once(db_path):
    c, host = controller({"path": db_path}, metrics=True)
    backup(c, host, TOKENS)
    backup(c, host, TOKENS)
    stats = c.storage_backend.get_stats()
    assert (stats.written_pages, stats.skipped_writes, stats.failed_writes) == (4, 4, 0)
    c.detach_storage_backend()


def test_get_stats_is_sglangs_storage_metrics_drained(db_path):
    c, host = controller({"path": db_path}, metrics=True)
    backup(c, host, TOKENS)
    prefetch(c, host, TOKENS + [1])  # a longer prompt: 4 of 4 whole pages stored
    stats = c.storage_backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    page_bytes = len(fk.page_bytes(host, 0))
    assert stats.backup_pgs == [4] and stats.prefetch_pgs == [4]
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    assert (stats.lookup_pages, stats.hit_pages) == (4, 4)
    assert (stats.read_pages, stats.read_bytes) == (4, 4 * page_bytes)
    assert stats.written_bytes == 4 * page_bytes
    again = c.storage_backend.get_stats()
    assert again.backup_pgs == [] and again.read_pages == 0  # drained
    c.detach_storage_backend()


@pytest.mark.parametrize("on", [True, False])
def test_batch_exists_prefetches_the_hit_pages_from_ssd(db_path, on):
    """After a restart the pages are on SSD only: the hit query (batch_exists) starts
    reading them up (DB::Prefetch), so the transfer that follows finds them in memory;
    the extra-config key "prefetch": false turns it off."""
    ssd = dict(ssd_capacity_bytes="64MiB", use_direct_io=False, promote_on_read=False)
    a, ha = controller({"path": db_path}, **ssd)
    _, saved = backup(a, ha, TOKENS)
    a.detach_storage_backend()  # the last user: the store closes, its pages go to SSD
    fk.set_parallel(0, 1)
    dev, hb = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    fk.fill_random(hb, 2)
    extra = dict(fk.kvengine_extra_config(path=db_path, **dict(SMALL, **ssd)), prefetch=on)
    b = fk.make_controller(dev, hb, extra)
    done, got = prefetch(b, hb, TOKENS + [1])
    assert done == 4 * PAGE and got == saved
    stats = b.storage_backend._store.stats()
    if on:
        assert stats["prefetch_requested"] == 4 and stats["prefetch_hits"] == 4
        assert stats["ssd_hits"] == 1  # the model's fingerprint record, read at start
    else:
        assert stats["prefetch_requested"] == 0 and stats["ssd_hits"] == 4 + 1  # + the record
    b.detach_storage_backend()


def test_clear_removes_this_models_pages_only(db_path):
    a, ha = controller({"path": db_path})
    fk.set_parallel(0, 1)
    dev, hb = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    other = fk.make_controller(dev, hb, fk.kvengine_extra_config(path=db_path, **SMALL),
                               model_name="other/model")
    backup(a, ha, TOKENS)
    backup(other, hb, TOKENS)
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    a.storage_backend.clear()
    assert a.storage_backend.batch_exists(hashes) == 0
    assert other.storage_backend.batch_exists(hashes) == 4
    a.detach_storage_backend()
    other.detach_storage_backend()


def test_the_extra_config_must_name_the_store(db_path):
    fk.set_parallel(0, 1)
    dev, host = fk.make_pools("mha", "page_first", torch.bfloat16)
    for extra, says in (({}, "exactly one of 'path'"),
                        ({"path": db_path, "attach": "/x.sock"}, "exactly one of 'path'"),
                        ({"path": db_path, "options": "64MiB"}, "'options'")):
        config = dict(fk.kvengine_extra_config(), **extra)
        with pytest.raises(ValueError, match=says):
            fk.make_controller(dev, host, config)
    with pytest.raises(ValueError, match="Missing required field 'class_name'"):
        fk.make_controller(dev, host, {"backend_name": "kvengine",
                                       "module_path": "kvengine.sglang", "path": db_path})
    with pytest.raises(ValueError, match="memory_capacity_bytes"):
        fk.make_controller(dev, host, fk.kvengine_extra_config(
            path=db_path, memory_capacity_bytes="lots"))


def test_failure_contract_outage_and_recovery(db_path, caplog):
    """Through a server socket (a kv_server, here this process): while the owner is gone
    every page fails -- all False, never None, never an exception into SGLang's threads
    -- and batch_exists counts none; once it serves again, pages move again."""
    sock = default_socket(db_path)
    owner = kvengine.DB(db_path, local_listen=sock, **SMALL)
    c, host = controller({"attach": sock})
    backend = c.storage_backend
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = host.alloc(4 * PAGE)
    assert backend.batch_set_v1(hashes, slots) == [True] * 4
    owner.close()
    with caplog.at_level(logging.WARNING, logger="kvengine.sglang"):
        assert backend.batch_get_v1(hashes, slots) == [False] * 4
        assert backend.batch_set_v1(hashes, slots) == [False] * 4
        assert backend.batch_exists(hashes) == 0
        assert backend.exists(hashes[0]) is False
        assert backend.get(hashes[0]) is None
        assert backend.batch_get(hashes[:2]) == [None, None]
        assert backend.batch_set(hashes[:2], [host.get_data_page(0)] * 2) is False
    assert "io_error" in caplog.text
    owner = kvengine.DB(db_path, local_listen=sock, **SMALL)  # back (flushed: pages kept)
    try:
        assert backend.batch_exists(hashes) == 4
        assert backend.batch_get_v1(hashes, slots) == [True] * 4
        assert backend.batch_set_v1(hashes, slots) == [True] * 4
    finally:
        c.detach_storage_backend()
        owner.close()


def test_a_bad_page_is_false_with_its_reason(db_path, caplog):
    c, host = controller({"path": db_path})
    backend = c.storage_backend
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = host.alloc(4 * PAGE)
    assert backend.batch_set_v1(hashes, slots) == [True] * 4
    # Another value under page 1's key (not a page of this pool): that page fails alone.
    key = backend._keys.pages([hashes[1]])[0]
    backend._store.remove(key)
    backend._store.put(key, b"short")
    with caplog.at_level(logging.INFO, logger="kvengine.sglang"):
        assert backend.batch_get_v1(hashes, slots) == [True, False, True, True]
    assert "a value of 5 bytes" in caplog.text
    # Host indices that do not cover the pages: all False, logged, nothing raised.
    assert backend.batch_get_v1(hashes, slots[:PAGE]) == [False] * 4
    assert backend.batch_set_v1(hashes, slots[:PAGE]) == [False] * 4
    assert "host indices" in caplog.text
    assert backend.batch_get_v1([], slots[:0]) == []
    c.detach_storage_backend()


def test_a_failed_pages_key_is_logged_shortened(db_path, caplog):
    """A page whose key is 64 KiB long (a hash string as long as that) fails alone, and
    its warning names the key as the library does: 64 bytes, its length and its hash
    (issue #49 item 4: the whole key filled the log line)."""
    c, host = controller({"path": db_path})
    backend = c.storage_backend
    slots = host.alloc(PAGE)
    long_hash = "h" * 65536
    with caplog.at_level(logging.INFO, logger="kvengine.sglang"):
        assert backend.batch_get_v1([long_hash], slots) == [False]
        assert backend.batch_set_v1([long_hash], slots) == [False]
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(len(line) < 1000 for line in lines), [len(x) for x in lines]
    assert all(kvengine.printable_key(long_hash) in line for line in lines), lines
    c.detach_storage_backend()


def test_an_mla_rank_other_than_0_writes_nothing(db_path):
    """MLA: one latent cache for every rank; rank 0 writes it (SGLang skips the others'
    backups, and the backend stores nothing for them even if asked)."""
    r0, h0 = controller({"path": db_path}, "mla", rank=0, tp_size=2, seed=3)
    r1, h1 = controller({"path": db_path}, "mla", rank=1, tp_size=2, seed=4)
    assert r1.backup_skip and not r0.backup_skip
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = h1.alloc(4 * PAGE)
    assert r1.storage_backend.batch_set_v1(hashes, slots) == [False] * 4  # not stored
    assert r0.storage_backend.batch_exists(hashes) == 0
    _, saved = backup(r0, h0, TOKENS)
    assert r1.storage_backend.batch_set_v1(hashes, slots) == [True] * 4  # rank 0's
    loaded, pages = prefetch(r1, h1, TOKENS)
    assert loaded == 4 * PAGE and pages == saved
    r0.detach_storage_backend()
    r1.detach_storage_backend()


def load_vllm(sched, worker, caches, none_hash, block_ids):
    """A vLLM request for TOKENS loading what the store has into block_ids: tokens."""
    import vllm_fakes as vf

    req = vf.Request("load%d" % block_ids[0], TOKENS, PAGE, none_hash)
    matched, _ = sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, vf.KVCacheBlocks(block_ids), matched)
    meta = sched.build_connector_meta(vf.new_step(new=[(req, block_ids, matched,
                                                        req.num_tokens - matched)]))
    vf.run_worker_step(worker, meta, caches, "flash_nhd")
    return matched


def test_a_vllm_block_and_an_sglang_page_never_collide(db_path):
    """vLLM's connector and SGLang's backend in one store, same model, same hash
    strings: their keys differ (SGLang's first segment is "sglang", vLLM's always
    holds "@"), both read back bit-exact, and each one's reset leaves the other's."""
    import vllm_fakes as vf
    from kvengine.vllm._vllm_compat import KVConnectorRole
    from kvengine.vllm.connector import KVEngineConnector

    model = "test/model"
    cfg = vf.make_config(db_path, model=model, block_size=PAGE, policy="recompute",
                         options=dict(SMALL))
    sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KVEngineConnector(cfg, KVConnectorRole.WORKER)
    caches = vf.make_caches("flash_nhd", block_size=PAGE)
    worker.register_kv_caches(caches)
    c, host = controller({"path": db_path})
    try:
        none_hash = vf._sha256("0")
        req = vf.Request("v", TOKENS, PAGE, none_hash)
        sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, vf.KVCacheBlocks([1, 2, 3, 4]), 0)
        meta = sched.build_connector_meta(vf.new_step(new=[(req, [1, 2, 3, 4], 0,
                                                            len(TOKENS))]))
        vf.run_worker_step(worker, meta, caches, "flash_nhd",
                           compute=list(zip([1, 2, 3, 4], req.block_hashes)))
        backend, store = c.storage_backend, c.storage_backend._store
        vllm_items = store.stats()["memory"]["items"]
        # SGLang pages under the very hash strings of vLLM's block keys.
        hashes = [bytes(h).hex() for h in req.block_hashes]
        slots = host.alloc(4 * PAGE)
        assert backend.batch_set_v1(hashes, slots) == [True] * 4
        assert store.stats()["memory"]["items"] == vllm_items + 4  # nothing replaced
        vllm_keys = [worker.connector_worker._layer_key(layer, h) for layer in
                     worker.connector_worker._layers for h in hashes]
        sglang_keys = backend._keys.pages(hashes)
        assert not set(vllm_keys) & set(sglang_keys)
        assert all("@" in k.split("/")[0] for k in vllm_keys)
        assert all(k.split("/")[0] == "sglang" for k in sglang_keys)
        # Both read back bit-exact: SGLang's pages at other slots, vLLM's blocks into
        # blocks 5..8.
        other = host.alloc(4 * PAGE)
        before = [fk.page_bytes(host, int(slots[i * PAGE])) for i in range(4)]
        assert backend.batch_get_v1(hashes, other) == [True] * 4
        assert [fk.page_bytes(host, int(other[i * PAGE])) for i in range(4)] == before
        assert load_vllm(sched, worker, caches, none_hash, [5, 6, 7, 8]) == 4 * PAGE
        for a_id, b_id in zip([1, 2, 3, 4], [5, 6, 7, 8]):
            for cache in caches.values():
                assert torch.equal(vf.block_view(cache, "flash_nhd", a_id),
                                   vf.block_view(cache, "flash_nhd", b_id))
        # SGLang's clear leaves vLLM's blocks; vLLM's reset leaves SGLang's pages.
        backend.clear()
        assert backend.batch_exists(hashes) == 0
        assert load_vllm(sched, worker, caches, none_hash, [9, 10, 11, 12]) == 4 * PAGE
        assert backend.batch_set_v1(hashes, slots) == [True] * 4
        sched.reset_cache()
        assert backend.batch_exists(hashes) == 4
        assert load_vllm(sched, worker, caches, none_hash, [13, 14, 15, 0]) == 0
    finally:
        c.detach_storage_backend()
        sched.shutdown()
        worker.shutdown()
