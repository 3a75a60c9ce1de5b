"""KVEngineConnector end to end with torch CPU KV caches and stand-ins of vLLM's objects."""
import pickle

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import kvengine  # noqa: E402
from kvengine.vllm import connector as conn_mod  # noqa: E402
from kvengine.vllm.connector import KVEngineConnector, KVEngineConnectorMetadata  # noqa: E402
from kvengine.vllm._vllm_compat import KVConnectorBase_V1, KVConnectorRole  # noqa: E402
import vllm_fakes as fk  # noqa: E402

BS = 16
LAYOUTS = ["flash", "blocks_first", "mla"]


class Instance:
    """One vLLM instance: a scheduler-side and a worker-side connector and its caches."""

    def __init__(self, path, layout, model="meta-llama/Llama-3-8B", **extra):
        if layout == "blocks_first":
            extra.setdefault("kv_cache_shape", "blocks_first")
        cfg = fk.make_config(path, model=model, block_size=BS, **extra)
        self.layout = layout
        self.sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
        self.worker = KVEngineConnector(cfg, KVConnectorRole.WORKER, kv_cache_config=None)
        self.caches = fk.make_caches(layout, block_size=BS)
        self.worker.register_kv_caches(self.caches)

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


@pytest.fixture
def store_path(db_path):
    return db_path


def test_is_a_connector_and_loadable_by_name(store_path):
    assert issubclass(KVEngineConnector, KVConnectorBase_V1)
    import importlib
    cls = getattr(importlib.import_module("kvengine.vllm.connector"), "KVEngineConnector")
    cfg = fk.make_config(store_path)
    c = cls(cfg, KVConnectorRole.SCHEDULER, None)  # the new factory's call
    c2 = cls(cfg, KVConnectorRole.WORKER)  # the old factory's call
    assert c.role == KVConnectorRole.SCHEDULER and c2.role == KVConnectorRole.WORKER
    assert c.request_finished(fk.Request("r", prompt(4), BS), []) == (False, None)
    assert c2.get_finished({"r"}) == (None, None)
    c.shutdown()
    c2.shutdown()
    with pytest.raises(ValueError, match="path"):
        KVEngineConnector(fk.make_config(""), KVConnectorRole.SCHEDULER)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_save_then_load_into_another_instance(store_path, layout):
    a = Instance(store_path, layout)
    b = Instance(store_path, layout)  # shares the process's store, as two vLLMs would
    try:
        req = fk.Request("req-a", prompt(5 * BS + 8), BS)  # 5 full blocks and a tail
        ids_a = [3, 7, 1, 9, 4, 8]
        matched, meta = prefill_on(a, req, ids_a)
        assert matched == 0 and not meta.loads
        assert [len(s.block_ids) for s in meta.saves] == [5]
        assert a.worker.num_saved_blocks == 5

        # Instance B: zeroed cache, different block ids, a request with the same prompt.
        req_b = fk.Request("req-b", prompt(5 * BS + 8), BS)
        ids_b = [10, 2, 5, 11, 0, 6]
        matched, meta = b.schedule_new(req_b, ids_b)
        assert matched == 5 * BS
        assert isinstance(meta, KVEngineConnectorMetadata)
        assert meta.loads[0].block_ids == ids_b[:5]
        fk.run_worker_step(b.worker, meta, b.caches, layout)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i in range(5):
            for la, lb in zip(a.block(ids_a[i]), b.block(ids_b[i])):
                assert torch.equal(la.view(torch.uint8), lb.view(torch.uint8))
        assert all(not t.any() for t in b.block(ids_b[5]))  # the tail was not loaded
        # B's save of the same blocks is deduplicated by batch_is_exist.
        assert b.worker.num_saved_blocks == 0
    finally:
        a.close()
        b.close()


def test_full_hit_leaves_one_token_to_compute(store_path):
    a = Instance(store_path, "flash")
    try:
        req = fk.Request("r1", prompt(4 * BS, seed=1), BS)
        prefill_on(a, req, [0, 1, 2, 3])
        again = fk.Request("r2", prompt(4 * BS, seed=1), BS)
        matched, meta = a.schedule_new(again, [4, 5, 6, 7])
        assert matched == 4 * BS - 1
        assert meta.loads[0].block_ids == [4, 5, 6, 7]  # the last block loads whole
        # With 2 blocks already computed locally, only the rest is new.
        local = fk.Request("r3", prompt(4 * BS, seed=1), BS)
        assert a.sched.get_num_new_matched_tokens(local, 2 * BS) == (2 * BS - 1, False)
        assert a.sched.get_num_new_matched_tokens(local, 4 * BS) == (0, False)
    finally:
        a.close()


def test_partial_hit_and_other_models(store_path):
    a = Instance(store_path, "flash")
    other = Instance(store_path, "flash", model="mistralai/Mistral-7B")
    try:
        req = fk.Request("r1", prompt(6 * BS, seed=2), BS)
        prefill_on(a, req, list(range(6)))
        db = a.sched._db
        assert db.remove(a.sched.block_key(req.block_hashes[3].hex())) == 0
        probe = fk.Request("r2", prompt(6 * BS, seed=2), BS)
        assert a.sched.get_num_new_matched_tokens(probe, 0) == (3 * BS, False)
        # A longer prompt with the same prefix hits its prefix.
        longer = fk.Request("r3", prompt(6 * BS, seed=2) + [1] * (3 * BS), BS)
        assert a.sched.get_num_new_matched_tokens(longer, 0) == (3 * BS, False)
        # Another model never sees these blocks.
        assert other.sched.get_num_new_matched_tokens(probe, 0) == (0, False)
        # A different prompt shares nothing.
        assert a.sched.get_num_new_matched_tokens(
            fk.Request("r4", prompt(6 * BS, seed=3), BS), 0) == (0, False)
    finally:
        a.close()
        other.close()


def test_failed_load_is_reported(store_path):
    a = Instance(store_path, "blocks_first")
    b = Instance(store_path, "blocks_first")
    try:
        req = fk.Request("r1", prompt(4 * BS + 1, seed=4), BS)
        prefill_on(a, req, [0, 1, 2, 3, 4])
        req_b = fk.Request("r2", prompt(4 * BS + 1, seed=4), BS)
        matched, meta = b.schedule_new(req_b, [9, 8, 7, 6, 5])
        assert matched == 4 * BS
        # Between the scheduler's check and the load, a block disappears (evicted).
        db = b.sched._db
        assert db.remove(b.worker.block_key(req.block_hashes[2].hex())) == 0
        # ... and another one is replaced by a value of the wrong size.
        assert db.put(b.worker.block_key(req.block_hashes[0].hex()), b"short") == 0
        fk.run_worker_step(b.worker, meta, b.caches, "blocks_first")
        assert b.worker.get_block_ids_with_load_errors() == {7, 9}
        assert b.worker.get_block_ids_with_load_errors() == set()  # reported once
        for i, bid in ((1, 8), (3, 6)):
            assert torch.equal(a.block(i)[0], b.block(bid)[0])
    finally:
        a.close()
        b.close()


def test_preemption_and_resume(store_path):
    a = Instance(store_path, "flash")
    b = Instance(store_path, "flash")
    try:
        req = fk.Request("r1", prompt(3 * BS + 4, seed=5), BS)
        prefill_on(a, req, [0, 1, 2, 3])
        req_b = fk.Request("rb", prompt(3 * BS + 4, seed=5), BS)
        matched, meta = b.schedule_new(req_b, [4, 5, 6, 7])
        assert matched == 3 * BS
        fk.run_worker_step(b.worker, meta, b.caches, "flash")
        # Preempted: its blocks are freed (and overwritten by someone else).
        out = fk.new_step(preempted={"rb"})
        meta = b.sched.build_connector_meta(out)
        assert meta.preempted_req_ids == ["rb"] and not meta.loads
        for c in b.caches.values():
            c.zero_()
        # Resumed with new block ids: the scheduler asks again and the load targets them.
        matched, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        assert matched == 3 * BS
        b.sched.update_state_after_alloc(req_b, fk.KVCacheBlocks([12, 13, 14, 15]), matched)
        out = fk.cached_step(["rb"], [([12, 13, 14, 15],)], [matched], [4], resumed={"rb"})
        meta = b.sched.build_connector_meta(out)
        assert meta.loads[0].block_ids == [12, 13, 14]
        fk.run_worker_step(b.worker, meta, b.caches, "flash")
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i, bid in enumerate([12, 13, 14]):
            assert torch.equal(a.block(i)[0], b.block(bid)[0])
        # Finished: its state is dropped on both sides.
        meta = b.sched.build_connector_meta(fk.new_step(finished={"rb"}))
        assert meta.finished_req_ids == ["rb"] and "rb" not in b.sched._requests
    finally:
        a.close()
        b.close()


def test_decode_steps_save_newly_full_blocks(store_path):
    a = Instance(store_path, "flash")
    try:
        req = fk.Request("r1", prompt(2 * BS - 1, seed=6), BS)
        matched, meta = a.schedule_new(req, [0, 1])
        assert [len(s.block_ids) for s in meta.saves] == [1]
        fk.run_worker_step(a.worker, meta, a.caches, "flash",
                           compute=[(0, req.block_hashes[0])])
        # A decode step fills block 1: vLLM extends the token list and the hashes.
        req.all_token_ids.append(99)
        req.block_hashes = fk.block_hashes(req.all_token_ids, BS)
        out = fk.cached_step(["r1"], [None], [2 * BS - 1], [1])
        meta = a.sched.build_connector_meta(out)
        assert meta.saves[0].block_ids == [1]
        fk.run_worker_step(a.worker, meta, a.caches, "flash",
                           compute=[(1, req.block_hashes[1])])
        assert a.worker.num_saved_blocks == 2
        keys = [a.sched.block_key(h.hex()) for h in req.block_hashes]
        assert a.sched._db.batch_is_exist(keys) == [1, 1]
    finally:
        a.close()


def test_metadata_pickles(store_path):
    a = Instance(store_path, "flash")
    try:
        req = fk.Request("r1", prompt(2 * BS, seed=7), BS)
        _, meta = a.schedule_new(req, [0, 1])
        meta.preempted_req_ids.append("x")
        again = pickle.loads(pickle.dumps(meta))
        assert again == meta and isinstance(again, KVEngineConnectorMetadata)
    finally:
        a.close()


def test_staged_path_round_trip(store_path):
    """The path GPU caches take (copies through a host staging buffer), forced on CPU."""
    a = Instance(store_path, "flash", force_staging=True)
    b = Instance(store_path, "flash")
    try:
        req = fk.Request("r1", prompt(3 * BS, seed=8), BS)
        prefill_on(a, req, [5, 6, 7])
        req_b = fk.Request("r2", prompt(3 * BS, seed=8), BS)
        _, meta = b.schedule_new(req_b, [0, 1, 2])
        fk.run_worker_step(b.worker, meta, b.caches, "flash")
        for ia, ib in zip([5, 6, 7], [0, 1, 2]):
            for la, lb in zip(a.block(ia), b.block(ib)):
                assert torch.equal(la, lb)
        c = Instance(store_path, "flash", force_staging=True)
        req_c = fk.Request("r3", prompt(3 * BS, seed=8), BS)
        _, meta = c.schedule_new(req_c, [9, 10, 11])
        fk.run_worker_step(c.worker, meta, c.caches, "flash")
        assert torch.equal(c.block(9)[1], a.block(5)[1])
        c.close()
    finally:
        a.close()
        b.close()


def test_layout_mismatch_and_bad_caches(store_path):
    cfg = fk.make_config(store_path, kv_layout="HND")
    w = KVEngineConnector(cfg, KVConnectorRole.WORKER)
    try:
        with pytest.raises(ValueError, match="NHD"):
            w.register_kv_caches(fk.make_caches("flash"))
        # An HND cache (heads before tokens in memory) is accepted under kv_layout=HND.
        raw = torch.zeros(2, 8, 4, 16, 8)  # (2, blocks, heads, block_size, head_size)
        w.register_kv_caches({"l0": raw.permute(0, 1, 3, 2, 4)})
        with pytest.raises(ValueError, match="unsupported shape"):
            w.register_kv_caches({"l0": torch.zeros(4, 4)})
    finally:
        w.shutdown()


def test_one_store_per_process(store_path):
    a = Instance(store_path, "flash")
    b = Instance(store_path, "flash")
    assert a.sched._db is b.worker._db
    a.close()
    assert b.sched._db.is_open
    b.close()
    assert store_path not in conn_mod._stores
    with kvengine.open(store_path, memory_capacity_bytes="16MiB", prefault_memory=False):
        pass  # the LOCK was released
