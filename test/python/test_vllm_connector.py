"""KVEngineConnector end to end with torch CPU KV caches and stand-ins of vLLM's objects."""
import logging
import pickle
import threading

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import kvengine  # noqa: E402
from kvengine.vllm import connector as conn_mod  # noqa: E402
from kvengine.vllm import scheduler as sched_mod  # noqa: E402
from kvengine import shared_store as store_mod  # noqa: E402
from kvengine.vllm.connector import KVEngineConnector, KVEngineConnectorMetadata  # noqa: E402
from kvengine.vllm._vllm_compat import (KVConnectorBase_V1, KVConnectorRole,  # noqa: E402
                                        SupportsHMA, supports_hma)
import vllm_fakes as fk  # noqa: E402

prometheus_client = pytest.importorskip(
    "prometheus_client",
    reason="prometheus_client is not installed (Debian: apt-get install python3-prometheus-client)")

BS = 16
WAIT = 30  # seconds: a bound on waits for the connector's threads, not a timing check


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    """Sharing across instances needs a fixed seed (the documented setup)."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")


class Instance:
    """One vLLM instance (its own engine process): a scheduler-side and a worker-side
    connector, its caches, and its process's NONE_HASH."""

    def __init__(self, path, layout, model="meta-llama/Llama-3-8B", dtype=torch.float16,
                 kv_cache_config=None, policy="fail", num_layers=3, **extra):
        cfg = fk.make_config(path, model=model, block_size=BS, dtype=dtype, policy=policy,
                             **extra)
        self.layout = layout
        self.none_hash = fk.init_none_hash()
        self.sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config)
        self.worker = KVEngineConnector(cfg, KVConnectorRole.WORKER, kv_cache_config)
        self.caches = fk.make_caches(layout, block_size=BS, dtype=dtype, num_layers=num_layers)
        self.worker.register_kv_caches(self.caches)

    def request(self, req_id, tokens):
        return fk.Request(req_id, tokens, BS, self.none_hash)

    def block(self, block_id):
        return [fk.block_view(c, self.layout, block_id).clone() for c in self.caches.values()]

    def schedule_new(self, req, block_ids, num_local=0):
        """Admits a new request as vLLM's scheduler does; returns (matched, meta)."""
        matched, is_async = self.sched.get_num_new_matched_tokens(req, num_local)
        assert is_async is False
        self.sched.update_state_after_alloc(req, fk.KVCacheBlocks(block_ids), matched)
        out = fk.new_step(new=[(req, block_ids, num_local + matched,
                                req.num_tokens - num_local - matched)])
        return matched, self.sched.build_connector_meta(out)

    def close(self):
        self.sched.shutdown()
        self.worker.shutdown()


def prompt(n, seed=0):
    return [(seed * 7919 + i * 31) % 32000 for i in range(n)]


def prefill_on(inst, req, block_ids):
    """Runs req's prefill on inst, computing and saving its blocks."""
    matched, meta = inst.schedule_new(req, block_ids)
    computed = [(block_ids[i], req.block_hashes[i]) for i in range(len(req.block_hashes))]
    fk.run_worker_step(inst.worker, meta, inst.caches, inst.layout, compute=computed)
    return matched, meta


def same_bytes(x, y):
    return torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


@pytest.fixture
def store_path(db_path):
    return db_path


def test_is_a_connector_and_loadable_by_name(store_path):
    assert issubclass(KVEngineConnector, KVConnectorBase_V1)
    assert issubclass(KVEngineConnector, SupportsHMA) and supports_hma(KVEngineConnector)
    import importlib
    cls = getattr(importlib.import_module("kvengine.vllm.connector"), "KVEngineConnector")
    cfg = fk.make_config(store_path)
    c = cls(cfg, KVConnectorRole.SCHEDULER, None)  # the new factory's call
    c2 = cls(cfg, KVConnectorRole.WORKER)  # the old factory's call
    try:
        assert c.role == KVConnectorRole.SCHEDULER and c2.role == KVConnectorRole.WORKER
        req = fk.Request("r", prompt(4), BS, fk.init_none_hash())
        assert c.request_finished(req, []) == (False, None)
        assert c.request_finished_all_groups(req, ([], [])) == (False, None)
        assert c2.get_finished({"r"}) == (None, None)
        # vLLM's defaults, where the connector keeps them, and its own answers.
        assert c.requires_kv_delivery is False  # the base says True for a kv_both producer
        assert c.get_finished_count() is None
        assert c.supports_divergent_local_hybrid_hits is False
        assert c.has_pending_block_frees() is False and c2.get_mem_pool_context() is None
        results = c2.get_transfer_results({"r"})  # what vLLM's model runner now collects
        assert (results.finished_sending, results.finished_recving,
                results.failed_recving, results.prefix_replay_checkpoints) == (
                    set(), set(), set(), {})
        # Loads and saves run per layer, so full CUDA graphs must not hide the hooks.
        assert cls.requires_piecewise_for_cudagraph({}) is True
        assert cls.requires_piecewise_for_cudagraph({"path": "/x"}) is True
        assert cls.get_required_kvcache_layout(cfg) is None
        assert list(c.take_events()) == [] and c.build_connector_worker_meta() is None
        assert c.on_new_request(req) is None and c.bind_gpu_block_pool(None) is None
        assert c.has_pending_push_work() is False
    finally:
        c.shutdown()
        c2.shutdown()
    with pytest.raises(ValueError, match="path"):
        KVEngineConnector(fk.make_config(""), KVConnectorRole.SCHEDULER)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", fk.LAYOUTS)
def test_save_then_load_into_another_instance(store_path, layout, dtype):
    a = Instance(store_path, layout, dtype=dtype)
    b = Instance(store_path, layout, dtype=dtype)  # shares the store, as two vLLMs would
    try:
        req = a.request("req-a", prompt(5 * BS + 8))  # 5 full blocks and a tail
        ids_a = [3, 7, 1, 9, 4, 8]
        matched, meta = prefill_on(a, req, ids_a)
        assert matched == 0 and not meta.loads
        assert [len(s.block_hashes) for s in meta.saves] == [5]
        assert a.worker.num_saved_blocks == 5

        # Instance B: zeroed cache, different block ids, a request with the same prompt.
        req_b = b.request("req-b", prompt(5 * BS + 8))
        ids_b = [10, 2, 5, 11, 0, 6]
        matched, meta = b.schedule_new(req_b, ids_b)
        assert matched == 5 * BS
        assert isinstance(meta, KVEngineConnectorMetadata)
        assert meta.loads[0].block_ids == [ids_b[:5]]
        fk.run_worker_step(b.worker, meta, b.caches, layout)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i in range(5):
            for la, lb in zip(a.block(ids_a[i]), b.block(ids_b[i])):
                assert same_bytes(la, lb)
        assert all(not t.any() for t in b.block(ids_b[5]))  # the tail was not loaded
        assert b.worker.num_saved_blocks == 0  # B's saves were deduplicated
    finally:
        a.close()
        b.close()


def test_steps_without_a_sync_load_start_their_loads_after_the_forward(store_path):
    """vLLM main (PR #53333) calls start_load_kv before the forward only on steps with a
    synchronous load (SchedulerOutput.has_sync_kv_loads); on the others it comes after the
    layers' wait_for_layer_load and save_kv_layer.  Such a step still saves, a following
    load step is bit-exact, and a step without loads after it neither waits on nor
    reports the former load."""
    layout = fk.LAYOUTS[0]
    a = Instance(store_path, layout)
    b = Instance(store_path, layout)
    try:
        req = a.request("req-a", prompt(4 * BS + 3))
        ids_a = [3, 7, 1, 9, 4]
        matched, meta = a.schedule_new(req, ids_a)
        assert matched == 0 and not meta.loads
        computed = [(ids_a[i], req.block_hashes[i]) for i in range(4)]
        fk.run_worker_step(a.worker, meta, a.caches, layout, compute=computed,
                           sync_loads=False)
        assert a.worker.num_saved_blocks == 4

        req_b = b.request("req-b", prompt(4 * BS + 3))
        ids_b = [10, 2, 5, 11, 0]
        matched, meta = b.schedule_new(req_b, ids_b)
        assert matched == 4 * BS and meta.loads
        fk.run_worker_step(b.worker, meta, b.caches, layout)  # a sync load: before
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i in range(4):
            for la, lb in zip(a.block(ids_a[i]), b.block(ids_b[i])):
                assert same_bytes(la, lb)
        # The next step (a decode: nothing to load) runs the layers before start_load_kv.
        step = fk.cached_step(["req-b"], [None], [4 * BS + 3], [1])
        meta = b.sched.build_connector_meta(step)
        assert not meta.loads
        fk.run_worker_step(b.worker, meta, b.caches, layout, sync_loads=False)
        assert b.worker.get_block_ids_with_load_errors() == set()
        out = fk.worker_output(b.worker)
        assert out.kv_connector_output.failed_recving == set()
    finally:
        a.close()
        b.close()


def test_saved_blocks_survive_a_restart(store_path):
    """With the default store options (write_back), what one instance saved is there for an
    instance started after the first one shut down: close() makes the store durable."""
    layout = fk.LAYOUTS[0]
    a = Instance(store_path, layout)
    req = a.request("req-a", prompt(4 * BS))
    ids_a = [2, 5, 1, 7]
    prefill_on(a, req, ids_a)
    saved = [a.block(i) for i in ids_a]
    a.close()  # the last user of the store: it is closed
    assert store_path not in store_mod._stores

    b = Instance(store_path, layout)  # a restarted instance: the store is opened anew
    try:
        req_b = b.request("req-b", prompt(4 * BS))
        ids_b = [9, 3, 0, 6]
        matched, meta = b.schedule_new(req_b, ids_b)
        assert matched == 4 * BS - 1  # every block: vLLM computes the last token itself
        fk.run_worker_step(b.worker, meta, b.caches, layout)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i in range(4):
            for la, lb in zip(saved[i], b.block(ids_b[i])):
                assert same_bytes(la, lb)
    finally:
        b.close()


@pytest.mark.parametrize("prefetch", [True, False])
def test_scheduler_lookup_prefetches_the_hit_for_the_load(store_path, prefetch):
    """After a restart the saved blocks are on SSD only: the scheduler's lookup starts
    reading the matched prefix up (batch_prefetch), so the worker's load finds it in memory
    (DB::Prefetch, docs/vllm.md); with "prefetch": False nothing is asked."""
    layout = fk.LAYOUTS[0]
    a = Instance(store_path, layout)
    ids_a = [2, 5, 1, 7]
    prefill_on(a, a.request("req-a", prompt(4 * BS)), ids_a)
    saved = [a.block(i) for i in ids_a]
    a.close()

    b = Instance(store_path, layout, prefetch=prefetch)
    try:
        req_b = b.request("req-b", prompt(4 * BS))
        ids_b = [9, 3, 0, 6]
        matched, meta = b.schedule_new(req_b, ids_b)
        assert matched == 4 * BS - 1
        fk.run_worker_step(b.worker, meta, b.caches, layout)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i in range(4):
            for la, lb in zip(saved[i], b.block(ids_b[i])):
                assert same_bytes(la, lb)
        stats = b.sched._db.stats()
        keys = 4 * len(b.caches)  # 4 blocks, one key per layer (TP 1)
        if prefetch:
            assert stats["prefetch_requested"] == keys
            assert stats["prefetch_hits"] == keys  # the load found every block in memory
            assert stats["ssd_hits"] == 1  # the model's fingerprint record, read at start
        else:
            assert stats["prefetch_requested"] == 0
            assert stats["ssd_hits"] > 0
    finally:
        b.close()


def test_todays_flash_attention_shape_is_accepted(store_path):
    """The report of issue 17: (48, 4, 16, 128) raised 'unsupported shape'."""
    w = KVEngineConnector(fk.make_config(store_path), KVConnectorRole.WORKER)
    try:
        nhd = torch.zeros(48, 16, 4, 128, dtype=torch.bfloat16).permute(0, 2, 1, 3)
        w.register_kv_caches({"l0": nhd, "l1": torch.zeros(48, 4, 16, 128)})
        tags = [la.geometry.tag for la in w.connector_worker._layers]
        assert tags == ["N16H4C128", "H4N16C128"]
        # The key names the byte order, so NHD and HND caches never share a key.
        assert w.connector_worker._layout_tag == "N16H4C128+H4N16C128"
    finally:
        w.shutdown()


def test_layouts_with_different_bytes_never_share_keys(store_path):
    nhd = Instance(store_path, "flash_nhd")
    hnd = Instance(store_path, "flash_hnd")
    legacy = Instance(store_path, "flash_legacy")
    first = Instance(store_path, "blocks_first")
    try:
        req = nhd.request("r1", prompt(3 * BS, seed=9))
        prefill_on(nhd, req, [0, 1, 2])
        probe = hnd.request("r2", prompt(3 * BS, seed=9))
        assert hnd.sched.get_num_new_matched_tokens(probe, 0) == (0, False)
        # The two split layouts hold the same bytes (K then V, each NHD): they share.
        prefill_on(legacy, legacy.request("r3", prompt(3 * BS, seed=10)), [0, 1, 2])
        probe = first.request("r4", prompt(3 * BS, seed=10))
        assert first.sched.get_num_new_matched_tokens(probe, 0) == (3 * BS - 1, False)
    finally:
        for inst in (nhd, hnd, legacy, first):
            inst.close()


def test_unknown_layout_is_refused_naming_shape_and_strides(store_path):
    w = KVEngineConnector(fk.make_config(store_path), KVConnectorRole.WORKER)
    try:
        with pytest.raises(ValueError, match=r"shape \(4, 4\), strides \(4, 1\)"):
            w.register_kv_caches({"l0": torch.zeros(4, 4)})
        # Blocks interleaved with another dim: (heads, blocks, ...) in memory.
        bad = torch.zeros(4, 8, 16, 16).permute(1, 0, 2, 3)
        with pytest.raises(ValueError, match=r"strides \(256, 2048, 16, 1\)"):
            w.register_kv_caches({"l0": bad})
        # A block that is not dense in its innermost dim.
        sparse = torch.zeros(8, 4, 16, 32)[..., ::2]
        with pytest.raises(ValueError, match="unsupported layout"):
            w.register_kv_caches({"l0": sparse})
    finally:
        w.shutdown()


def test_full_hit_leaves_one_token_to_compute(store_path):
    a = Instance(store_path, "flash_nhd")
    try:
        req = a.request("r1", prompt(4 * BS, seed=1))
        prefill_on(a, req, [0, 1, 2, 3])
        again = a.request("r2", prompt(4 * BS, seed=1))
        matched, meta = a.schedule_new(again, [4, 5, 6, 7])
        assert matched == 4 * BS - 1
        assert meta.loads[0].block_ids == [[4, 5, 6, 7]]  # the last block loads whole
        local = a.request("r3", prompt(4 * BS, seed=1))
        assert a.sched.get_num_new_matched_tokens(local, 2 * BS) == (2 * BS - 1, False)
        assert a.sched.get_num_new_matched_tokens(local, 4 * BS) == (0, False)
    finally:
        a.close()


def test_partial_hit_misses_and_other_models(store_path):
    a = Instance(store_path, "flash_nhd")
    other = Instance(store_path, "flash_nhd", model="mistralai/Mistral-7B")
    try:
        req = a.request("r1", prompt(6 * BS, seed=2))
        prefill_on(a, req, list(range(6)))
        db = a.sched._db
        # One layer of block 3 gone is enough to end the prefix there.
        assert db.remove(a.worker.block_key(req.block_hashes[3].hex(), layer=1)) == 0
        probe = a.request("r2", prompt(6 * BS, seed=2))
        assert a.sched.get_num_new_matched_tokens(probe, 0) == (3 * BS, False)
        longer = a.request("r3", prompt(6 * BS, seed=2) + [1] * (3 * BS))
        assert a.sched.get_num_new_matched_tokens(longer, 0) == (3 * BS, False)
        assert other.sched.get_num_new_matched_tokens(probe, 0) == (0, False)
        miss = a.request("r4", prompt(6 * BS, seed=3))
        assert a.sched.get_num_new_matched_tokens(miss, 0) == (0, False)
    finally:
        a.close()
        other.close()


def test_publishable_hashes_limit_saves(store_path):
    a = Instance(store_path, "flash_nhd")
    try:
        req = a.request("r1", prompt(4 * BS, seed=11))
        req.num_publishable_block_hashes = 2  # vLLM: the rest may still change
        _, meta = prefill_on(a, req, [0, 1, 2, 3])
        assert [len(s.block_hashes) for s in meta.saves] == [2]
        assert a.worker.num_saved_blocks == 2
    finally:
        a.close()


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_block_vanishing_between_lookup_and_load(store_path, policy):
    a = Instance(store_path, "blocks_first")
    b = Instance(store_path, "blocks_first", policy=policy)
    try:
        req = a.request("r1", prompt(4 * BS + 1, seed=4))
        prefill_on(a, req, [0, 1, 2, 3, 4])
        req_b = b.request("r2", prompt(4 * BS + 1, seed=4))
        ids_b = [9, 8, 7, 6, 5]
        matched, meta = b.schedule_new(req_b, ids_b)
        assert matched == 4 * BS
        req_b.num_computed_tokens = matched
        # Between the scheduler's lookup and the load, block 2 is evicted.
        db = b.sched._db
        for layer in range(len(b.caches)):
            assert db.remove(b.worker.block_key(req.block_hashes[2].hex(), layer)) == 0
        fk.run_worker_step(b.worker, meta, b.caches, "blocks_first")
        failed = b.worker.get_block_ids_with_load_errors()
        assert failed == {7}
        assert b.worker.get_block_ids_with_load_errors() == set()  # reported once
        for i, bid in ((1, 8), (3, 6)):
            assert same_bytes(a.block(i)[0], b.block(bid)[0])
        status = fk.handle_load_errors(policy, req_b, ids_b, failed, BS)
        if policy == "fail":
            assert status == "FINISHED_ERROR"
        else:
            assert status == "RUNNING" and req_b.num_computed_tokens == 2 * BS
    finally:
        a.close()
        b.close()


def test_wrong_size_value_is_a_load_error(store_path):
    a = Instance(store_path, "flash_legacy")
    try:
        req = a.request("r1", prompt(2 * BS + 1, seed=12))
        prefill_on(a, req, [0, 1, 2])
        again = a.request("r2", prompt(2 * BS + 1, seed=12))
        _, meta = a.schedule_new(again, [5, 6, 7])
        db = a.sched._db
        assert db.put(a.worker.block_key(req.block_hashes[0].hex(), layer=2), b"short") == 0
        fk.run_worker_step(a.worker, meta, a.caches, "flash_legacy")
        assert a.worker.get_block_ids_with_load_errors() == {5}
    finally:
        a.close()


def test_a_block_id_outside_the_cache_fails_and_says_why(store_path, caplog):
    """A block id the caches do not have (vLLM's never are; a caller's bug, such as a
    test asking for block 16 of 16) is a load error and no save, each with a warning
    naming the block and the cache's size -- not a silent failure."""
    a = Instance(store_path, "flash_nhd")
    try:
        req = a.request("r1", prompt(3 * BS + 1, seed=21))
        ids = [0, 1, 16, 3]
        _, meta = a.schedule_new(req, ids)
        with caplog.at_level(logging.WARNING, logger="kvengine.vllm"):
            fk.run_worker_step(a.worker, meta, a.caches, "flash_nhd",
                               [(b, h) for b, h in zip(ids, req.block_hashes) if b != 16])
        saves = [r.getMessage() for r in caplog.records if "not saved" in r.getMessage()]
        assert len(saves) == len(a.caches) and "[16]" in saves[0] and "16 blocks" in saves[0]
        caplog.clear()
        again = a.request("r2", prompt(3 * BS + 1, seed=21))
        matched, meta = a.schedule_new(again, [5, 6, 7, 8])
        assert matched == 2 * BS  # block 2 was never saved
        _, meta = a.schedule_new(a.request("r3", prompt(3 * BS + 1, seed=21)), [9, 17, 10, 11])
        with caplog.at_level(logging.WARNING, logger="kvengine.vllm"):
            fk.run_worker_step(a.worker, meta, a.caches, "flash_nhd")
        assert a.worker.get_block_ids_with_load_errors() == {17}
        loads = [r.getMessage() for r in caplog.records if "not loaded" in r.getMessage()]
        assert len(loads) == 1 and "[17]" in loads[0] and "16 blocks" in loads[0]
        assert same_bytes(a.block(0)[0], a.block(9)[0])
    finally:
        a.close()


def test_preemption_and_resume(store_path):
    a = Instance(store_path, "flash_hnd")
    b = Instance(store_path, "flash_hnd")
    try:
        req = a.request("r1", prompt(3 * BS + 4, seed=5))
        prefill_on(a, req, [0, 1, 2, 3])
        req_b = b.request("rb", prompt(3 * BS + 4, seed=5))
        matched, meta = b.schedule_new(req_b, [4, 5, 6, 7])
        assert matched == 3 * BS
        fk.run_worker_step(b.worker, meta, b.caches, "flash_hnd")
        out = fk.new_step(preempted={"rb"})
        meta = b.sched.build_connector_meta(out)
        assert meta.preempted_req_ids == ["rb"] and not meta.loads
        for c in b.caches.values():
            c.zero_()
        matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        assert matched == 3 * BS
        b.sched.update_state_after_alloc(req_b, fk.KVCacheBlocks([12, 13, 14, 15]), matched)
        out = fk.cached_step(["rb"], [([12, 13, 14, 15],)], [matched], [4], resumed={"rb"})
        meta = b.sched.build_connector_meta(out)
        assert meta.loads[0].block_ids == [[12, 13, 14]]
        fk.run_worker_step(b.worker, meta, b.caches, "flash_hnd")
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i, bid in enumerate([12, 13, 14]):
            assert same_bytes(a.block(i)[0], b.block(bid)[0])
        meta = b.sched.build_connector_meta(fk.new_step(finished={"rb"}))
        assert meta.finished_req_ids == ["rb"]
        assert "rb" not in b.sched.connector_scheduler._requests
    finally:
        a.close()
        b.close()


def test_decode_steps_save_newly_full_blocks(store_path):
    a = Instance(store_path, "flash_nhd")
    try:
        req = a.request("r1", prompt(2 * BS - 1, seed=6))
        matched, meta = a.schedule_new(req, [0, 1])
        assert [len(s.block_hashes) for s in meta.saves] == [1]
        fk.run_worker_step(a.worker, meta, a.caches, "flash_nhd",
                           compute=[(0, req.block_hashes[0])])
        req.all_token_ids.append(99)
        req.update_block_hashes()
        out = fk.cached_step(["r1"], [None], [2 * BS - 1], [1])
        meta = a.sched.build_connector_meta(out)
        assert meta.saves[0].block_ids == [[1]]
        fk.run_worker_step(a.worker, meta, a.caches, "flash_nhd",
                           compute=[(1, req.block_hashes[1])])
        assert a.worker.num_saved_blocks == 2
    finally:
        a.close()


def test_metadata_pickles(store_path):
    a = Instance(store_path, "flash_nhd")
    try:
        req = a.request("r1", prompt(2 * BS, seed=7))
        _, meta = a.schedule_new(req, [0, 1])
        meta.preempted_req_ids.append("x")
        again = pickle.loads(pickle.dumps(meta))
        assert again == meta and isinstance(again, KVEngineConnectorMetadata)
    finally:
        a.close()


def test_staged_path_round_trip(store_path):
    """The path GPU caches take (copies through a host staging buffer), forced on CPU."""
    a = Instance(store_path, "flash_nhd", force_staging=True)
    b = Instance(store_path, "flash_nhd")
    c = Instance(store_path, "flash_nhd", force_staging=True)
    try:
        req = a.request("r1", prompt(3 * BS, seed=8))
        prefill_on(a, req, [5, 6, 7])
        _, meta = b.schedule_new(b.request("r2", prompt(3 * BS, seed=8)), [0, 1, 2])
        fk.run_worker_step(b.worker, meta, b.caches, "flash_nhd")
        for ia, ib in zip([5, 6, 7], [0, 1, 2]):
            for la, lb in zip(a.block(ia), b.block(ib)):
                assert same_bytes(la, lb)
        _, meta = c.schedule_new(c.request("r3", prompt(3 * BS, seed=8)), [9, 10, 11])
        fk.run_worker_step(c.worker, meta, c.caches, "flash_nhd")
        assert same_bytes(c.block(9)[1], a.block(5)[1])
    finally:
        a.close()
        b.close()
        c.close()


class GatedStore:
    """Wraps the store; the report of layer `gated` of a layer-wise load waits for
    `release`."""

    def __init__(self, db, gated):
        self._db, self._gated = db, gated
        self.release, self.reached = threading.Event(), threading.Event()

    def batch_get_into_groups(self, keys, ptrs, sizes, group_ends, on_ready):
        def gated(group, results):
            if group == self._gated:
                self.reached.set()
                assert self.release.wait(WAIT)
            on_ready(group, results)

        return self._db.batch_get_into_groups(keys, ptrs, sizes, group_ends, gated)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_first_layer_is_ready_while_the_last_is_loading(store_path):
    a = Instance(store_path, "flash_nhd", num_layers=4)
    b = Instance(store_path, "flash_nhd", num_layers=4)
    try:
        req = a.request("r1", prompt(3 * BS, seed=13))
        prefill_on(a, req, [0, 1, 2])
        _, meta = b.schedule_new(b.request("r2", prompt(3 * BS, seed=13)), [3, 4, 5])
        gate = GatedStore(b.worker._db, gated=3)
        b.worker.connector_worker._db = gate
        b.worker.bind_connector_metadata(meta)
        b.worker.start_load_kv(fk.Forward())
        names = list(b.caches)
        b.worker.wait_for_layer_load(names[0])  # returns although layer 3 is held back
        assert same_bytes(a.block(0)[0], b.block(3)[0])
        assert gate.reached.wait(WAIT)
        job = b.worker.connector_worker._load_job
        assert not job.events[3].is_set()
        gate.release.set()
        b.worker.wait_for_layer_load(names[3])
        assert same_bytes(a.block(0)[3], b.block(3)[3])
        b.worker.wait_for_save()
        b.worker.clear_connector_metadata()
        assert b.worker.get_block_ids_with_load_errors() == set()
    finally:
        a.close()
        b.close()


def test_saves_start_per_layer(store_path):
    """save_kv_layer hands the layer to the save thread before the next layer runs."""
    a = Instance(store_path, "flash_nhd", num_layers=3)
    try:
        req = a.request("r1", prompt(2 * BS, seed=14))
        _, meta = a.schedule_new(req, [0, 1])
        fk.fill_block(a.caches, "flash_nhd", 0, req.block_hashes[0])
        fk.fill_block(a.caches, "flash_nhd", 1, req.block_hashes[1])
        a.worker.bind_connector_metadata(meta)
        a.worker.start_load_kv(fk.Forward())
        first = list(a.caches)[0]
        a.worker.save_kv_layer(first, a.caches[first], None)
        # Layer 0 is stored before layer 1 "runs".
        a.worker.connector_worker._save_futures[0].result(WAIT)
        key = a.worker.block_key(req.block_hashes[0].hex(), layer=0)
        assert a.sched._db.is_exist(key) == 1
        key1 = a.worker.block_key(req.block_hashes[0].hex(), layer=1)
        assert a.sched._db.is_exist(key1) == 0
        a.worker.wait_for_save()  # saves the layers vLLM did not hand over
        assert a.sched._db.is_exist(key1) == 1
        a.worker.clear_connector_metadata()
    finally:
        a.close()


def test_hash_seed_warning(store_path, monkeypatch, caplog):
    monkeypatch.delenv("PYTHONHASHSEED")
    monkeypatch.setattr(sched_mod, "_hash_seed_warned", False)
    with caplog.at_level(logging.WARNING, logger="kvengine.vllm"):
        a = Instance(store_path, "flash_nhd")
        b = Instance(store_path, "flash_nhd")
    try:
        warnings = [r for r in caplog.records if "PYTHONHASHSEED" in r.getMessage()]
        assert len(warnings) == 1 and "PYTHONHASHSEED=0" in warnings[0].getMessage()
        # What the warning is about: each engine process seeds its own chain.
        req = a.request("r1", prompt(2 * BS, seed=15))
        prefill_on(a, req, [0, 1])
        probe = b.request("r2", prompt(2 * BS, seed=15))
        assert b.sched.get_num_new_matched_tokens(probe, 0) == (0, False)
    finally:
        a.close()
        b.close()


def test_fail_policy_warning(store_path, caplog):
    with caplog.at_level(logging.WARNING, logger="kvengine.vllm"):
        a = Instance(store_path, "flash_nhd", policy="fail")
        b = Instance(store_path, "flash_nhd", policy="recompute")
    a.close()
    b.close()
    fails = [r for r in caplog.records if "kv_load_failure_policy" in r.getMessage()]
    assert len(fails) == 1


def test_stats_and_prometheus_metrics(store_path):
    a = Instance(store_path, "flash_nhd")
    b = Instance(store_path, "flash_nhd")
    try:
        req = a.request("r1", prompt(3 * BS, seed=16))
        prefill_on(a, req, [0, 1, 2])
        saved = a.worker.get_kv_connector_stats()
        per_block = sum(la.geometry.block_bytes for la in a.worker.connector_worker._layers)
        assert saved.data["saved_blocks"] == 3 and saved.data["saved_bytes"] == 3 * per_block
        assert len(saved.data["save_seconds"]) == 1
        assert a.worker.get_kv_connector_stats() is None  # reset by the call
        _, meta = b.schedule_new(b.request("r2", prompt(3 * BS, seed=16)), [3, 4, 5])
        fk.run_worker_step(b.worker, meta, b.caches, "flash_nhd")
        sched = b.sched.get_kv_connector_stats()
        assert sched.data["hit_tokens"] == 3 * BS - 1
        loaded = b.worker.get_kv_connector_stats()
        assert loaded.data["loaded_bytes"] == 3 * per_block
        # vLLM ships .data across processes and rebuilds it with the class method.
        total = KVEngineConnector.build_kv_connector_stats(pickle.loads(pickle.dumps(sched.data)))
        total = total.aggregate(loaded).aggregate(saved)
        reduced = total.reduce()
        assert reduced["hit_tokens"] == 3 * BS - 1 and reduced["saved_blocks"] == 3
        assert reduced["loaded_bytes"] == 3 * per_block
    finally:
        a.close()
        b.close()


def _steps_stats(path, seed):
    """A save on one instance and a load on another: the scheduler's, the loading
    worker's and the saving worker's stats of those steps."""
    a = Instance(path, "flash_nhd")
    b = Instance(path, "flash_nhd")
    try:
        prefill_on(a, a.request("r1", prompt(3 * BS, seed=seed)), [0, 1, 2])
        saved = a.worker.get_kv_connector_stats()
        _, meta = b.schedule_new(b.request("r2", prompt(3 * BS, seed=seed)), [3, 4, 5])
        fk.run_worker_step(b.worker, meta, b.caches, "flash_nhd")
        per_block = sum(la.geometry.block_bytes for la in a.worker.connector_worker._layers)
        return [b.sched.get_kv_connector_stats(), b.worker.get_kv_connector_stats(),
                saved], per_block
    finally:
        a.close()
        b.close()


def _interval_data(stats):
    """What vLLM's scheduler ships for one interval: the stats aggregated across ranks,
    as .data (SchedulerStats.kv_connector_stats)."""
    total = KVEngineConnector.build_kv_connector_stats()
    for s in stats:
        total = total.aggregate(s)
    return pickle.loads(pickle.dumps(total.data))


def _sample(registry, name, engine, model="m"):
    return registry.get_sample_value(name, {"model_name": model, "engine": str(engine)})


def test_vllm_prometheus_logger_observes_two_engines(store_path, tmp_path):
    """vLLM main's KVConnectorProm, built as its PrometheusStatLogger builds it (the
    default for vllm serve), constructs our metrics and records two engines apart."""
    registry = prometheus_client.CollectorRegistry()
    stats0, per_block = _steps_stats(store_path, seed=30)
    stats1, _ = _steps_stats(str(tmp_path / "second"), seed=31)
    cfg = fk.make_config(store_path)
    prom = fk.prom_logger_class(registry)(cfg, fk.VLLM_LABELNAMES,
                                          fk.per_engine_labelvalues("m", [0, 1]))
    assert isinstance(prom.prom_metrics, conn_mod.KVEnginePromMetrics)
    prom.observe(_interval_data(stats0), engine_idx=0)
    prom.observe(_interval_data(stats1), engine_idx=1)
    prom.observe(_interval_data(stats1[:1]), engine_idx=1)  # a second interval
    assert _sample(registry, "vllm:kvengine_hit_tokens_total", 0) == 3 * BS - 1
    assert _sample(registry, "vllm:kvengine_hit_tokens_total", 1) == 2 * (3 * BS - 1)
    for engine in (0, 1):
        assert _sample(registry, "vllm:kvengine_loaded_bytes_total", engine) == 3 * per_block
        assert _sample(registry, "vllm:kvengine_saved_bytes_total", engine) == 3 * per_block
        assert _sample(registry, "vllm:kvengine_load_seconds_count", engine) == 1
        assert _sample(registry, "vllm:kvengine_save_seconds_count", engine) == 1
        assert _sample(registry, "vllm:kvengine_load_errors_total", engine) == 0
    text = prometheus_client.generate_latest(registry).decode()
    assert 'vllm:kvengine_load_seconds_bucket{engine="1",le="0.0005",model_name="m"}' in text


def test_vllm_multiconnector_prometheus_observes_shipped_stats(store_path):
    """The same through vLLM's MultiConnector: the stats reach the front end as
    MultiKVConnectorStats.to_dict() ({child class name: its data}), and are rebuilt by
    the child's registered name."""
    registry = prometheus_client.CollectorRegistry()
    conn_mod.register_with_factory(fk.KVConnectorFactory)
    conn_mod.register_with_factory(fk.KVConnectorFactory)  # twice is harmless
    stats, per_block = _steps_stats(store_path, seed=32)
    child = dict(kv_connector="KVEngineConnector", kv_role="kv_both",
                 kv_connector_module_path="kvengine.vllm.connector",
                 kv_connector_extra_config=fk.make_config(store_path)
                 .kv_transfer_config.kv_connector_extra_config)
    cfg = fk.make_config(store_path)
    cfg.kv_transfer_config = fk.KVTransferConfig(
        kv_connector="MultiConnector", kv_role="kv_both",
        kv_connector_extra_config={"connectors": [child, dict(child)]})
    assert fk.MultiConnector.requires_piecewise_for_cudagraph(
        cfg.kv_transfer_config.kv_connector_extra_config) is True
    prom = fk.prom_logger_class(registry)(cfg, fk.VLLM_LABELNAMES,
                                          fk.per_engine_labelvalues("m", [0, 1]))
    assert isinstance(prom.prom_metrics, fk.MultiKVConnectorPromMetrics)
    multi = fk.MultiKVConnectorStats()
    for s in stats:  # MultiConnector.get_kv_connector_stats groups by class name
        multi = multi.aggregate(fk.MultiKVConnectorStats(data={"KVEngineConnector": s}))
    shipped = multi.to_dict()
    rebuilt = fk.MultiConnector.build_kv_connector_stats(pickle.loads(pickle.dumps(shipped)))
    assert rebuilt.reduce()["KVEngineConnector"]["hit_tokens"] == 3 * BS - 1
    for engine in (0, 1):
        prom.observe(shipped, engine_idx=engine)
        assert _sample(registry, "vllm:kvengine_hit_tokens_total", engine) == 3 * BS - 1
        assert _sample(registry, "vllm:kvengine_loaded_bytes_total", engine) == 3 * per_block
        assert _sample(registry, "vllm:kvengine_save_seconds_count", engine) == 1


def test_reset_cache_forgets_this_models_blocks(store_path):
    a = Instance(store_path, "flash_nhd")
    other = Instance(store_path, "flash_nhd", model="mistralai/Mistral-7B")
    try:
        prefill_on(a, a.request("r1", prompt(2 * BS, seed=17)), [0, 1])
        prefill_on(other, other.request("r1", prompt(2 * BS, seed=17)), [0, 1])
        assert a.sched.reset_cache() is True
        assert a.sched.get_num_new_matched_tokens(
            a.request("r2", prompt(2 * BS, seed=17)), 0) == (0, False)
        assert other.sched.get_num_new_matched_tokens(
            other.request("r2", prompt(2 * BS, seed=17)), 0) == (2 * BS - 1, False)
        # The instance keeps working: new blocks are saved and found again.
        prefill_on(a, a.request("r3", prompt(2 * BS, seed=18)), [0, 1])
        assert a.sched.get_num_new_matched_tokens(
            a.request("r4", prompt(2 * BS, seed=18)), 0) == (2 * BS - 1, False)
    finally:
        a.close()
        other.close()


def test_hybrid_groups_address_their_own_blocks(store_path):
    """SupportsHMA: each layer reads the block ids of its KV-cache group."""
    names = ["model.layers.%d.self_attn.attn" % i for i in range(3)]
    kcc = fk.KVCacheConfig(16, [], [fk.KVCacheGroupSpec(names[:2], None),
                                    fk.KVCacheGroupSpec(names[2:], None)])
    a = Instance(store_path, "flash_nhd", kv_cache_config=kcc)
    b = Instance(store_path, "flash_nhd", kv_cache_config=kcc)
    try:
        req = a.request("r1", prompt(2 * BS, seed=19))
        fk.fill_block(a.caches, "flash_nhd", 0, req.block_hashes[0])
        fk.fill_block(a.caches, "flash_nhd", 1, req.block_hashes[1])
        a.sched.get_num_new_matched_tokens(req, 0)
        a.sched.update_state_after_alloc(req, None, 0)
        out = fk.new_step(new=[(req, [0, 1], 0, 2 * BS)])
        out.scheduled_new_reqs[0].block_ids = ([0, 1], [0, 1])
        fk.run_worker_step(a.worker, a.sched.build_connector_meta(out), a.caches, "flash_nhd")
        req_b = b.request("r2", prompt(2 * BS + 1, seed=19))
        matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        assert matched == 2 * BS
        b.sched.update_state_after_alloc(req_b, None, matched)
        out = fk.new_step(new=[(req_b, [4, 5, 6], matched, 1)])
        out.scheduled_new_reqs[0].block_ids = ([4, 5, 6], [10, 11, 12])
        meta = b.sched.build_connector_meta(out)
        assert meta.loads[0].block_ids == [[4, 5], [10, 11]]
        fk.run_worker_step(b.worker, meta, b.caches, "flash_nhd")
        for pos, (g0, g1) in enumerate([(4, 10), (5, 11)]):
            got = b.block(g0)[:2] + [b.block(g1)[2]]
            for la, lb in zip(a.block(pos), got):
                assert same_bytes(la, lb)
    finally:
        a.close()
        b.close()


def test_a_block_of_hybrid_groups_is_hit_and_loaded_whole_or_not_at_all(store_path):
    """SupportsHMA, the page-group rule: a block position counts as a hit only when every
    KV-cache group's layers have it (the scheduler), and a layer of one group that fails
    to load between the match and the load fails the position in every group (the
    worker reports the block ids of all groups), so vLLM never runs a block whose
    full-attention KV loaded beside a sliding-window or state group that did not."""
    names = ["model.layers.%d.self_attn.attn" % i for i in range(3)]
    kcc = fk.KVCacheConfig(16, [], [fk.KVCacheGroupSpec(names[:2], None),
                                    fk.KVCacheGroupSpec(names[2:], None)])
    a = Instance(store_path, "flash_nhd", kv_cache_config=kcc)
    b = Instance(store_path, "flash_nhd", kv_cache_config=kcc)
    try:
        req = a.request("r1", prompt(3 * BS, seed=23))
        for pos in range(3):
            fk.fill_block(a.caches, "flash_nhd", pos, req.block_hashes[pos])
        a.sched.get_num_new_matched_tokens(req, 0)
        a.sched.update_state_after_alloc(req, None, 0)
        out = fk.new_step(new=[(req, [0, 1, 2], 0, 3 * BS)])
        out.scheduled_new_reqs[0].block_ids = ([0, 1, 2], [0, 1, 2])
        fk.run_worker_step(a.worker, a.sched.build_connector_meta(out), a.caches, "flash_nhd")
        db = a.worker._db
        # The second group's layer of block 2 is gone: the hit stops before block 2.
        assert db.remove(a.worker.block_key(req.block_hashes[2].hex(), layer=2)) == 0
        req_b = b.request("r2", prompt(3 * BS + 1, seed=23))
        matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        assert matched == 2 * BS
        # Between the match and the load, block 1 of the second group goes too.
        b.sched.update_state_after_alloc(req_b, None, matched)
        out = fk.new_step(new=[(req_b, [4, 5, 6], matched, 1)])
        out.scheduled_new_reqs[0].block_ids = ([4, 5, 6], [10, 11, 12])
        meta = b.sched.build_connector_meta(out)
        assert db.remove(a.worker.block_key(req.block_hashes[1].hex(), layer=2)) == 0
        fk.run_worker_step(b.worker, meta, b.caches, "flash_nhd")
        # Block position 1 failed whole: its first group's id (5) with the second's (11),
        # though the first group's layers of it were read.
        assert b.worker.get_block_ids_with_load_errors() == {5, 11}
        got = b.block(4)[:2] + [b.block(10)[2]]
        for la, lb in zip(a.block(0), got):
            assert same_bytes(la, lb)
    finally:
        a.close()
        b.close()


def test_one_store_per_process(store_path):
    a = Instance(store_path, "flash_nhd")
    b = Instance(store_path, "flash_nhd")
    assert a.sched._db is b.worker._db
    a.close()
    assert b.sched._db.is_open
    b.close()
    assert store_path not in store_mod._stores
    with kvengine.open(store_path, memory_capacity_bytes="16MiB", prefault_memory=False):
        pass  # the LOCK was released
