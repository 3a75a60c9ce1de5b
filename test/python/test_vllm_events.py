"""KV cache events through vLLM's own path (vllm_fakes: KVOutputAggregator, the
scheduler's publishing, msgpack as vLLM's publisher encodes): BlockStored for saved
blocks, BlockRemoved (medium KVENGINE_MEMORY / KVENGINE_SSD) for blocks kvengine evicted
or deleted, at TP=1 and TP=2, and only what every rank reported."""
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")
msgpack = pytest.importorskip(
    "msgpack", reason="msgpack is not installed (Debian: apt-get install python3-msgpack)")

from kvengine.vllm._vllm_compat import (BlockRemoved, BlockStored,  # noqa: E402
                                        KVConnectorRole)
from kvengine.vllm.connector import KVEngineConnector  # noqa: E402
from kvengine.vllm.events import MEDIUM_MEMORY, MEDIUM_SSD, external_hash  # noqa: E402
import vllm_fakes as fk  # noqa: E402

BS = 16
LAYOUT = "flash_nhd"
VALUE = 4 * 2 * 8 * BS * 2  # one block of one layer: heads x (K, V) x head x bs x fp16


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


class Instance:
    """A vLLM instance with KV events on: a scheduler-side connector and `tp` workers."""

    def __init__(self, path, tp=1, events=True, **options):
        opts = dict(memory_capacity_bytes="64MiB", prefault_memory=False,
                    apply_environment=False)
        opts.update(options)
        self.workers, self.caches = [], []
        self.none_hash = fk.init_none_hash()
        for rank in [None] + list(range(tp)):
            extra = dict(options=opts, engine_id="E")
            if rank is not None:
                extra["tp_rank"] = rank
            cfg = fk.make_config(path, block_size=BS, **extra)
            cfg.parallel_config.tensor_parallel_size = tp
            cfg.kv_events_config = fk.KVEventsConfig(enable_kv_cache_events=events)
            if rank is None:
                self.sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
                continue
            worker = KVEngineConnector(cfg, KVConnectorRole.WORKER)
            caches = fk.make_caches(LAYOUT, block_size=BS)
            worker.register_kv_caches(caches)
            self.workers.append(worker)
            self.caches.append(caches)
        self.db = self.sched._db

    def step(self, new=(), compute=True):
        """One engine step: schedules the new requests [(req, block ids)], runs every
        worker, merges their outputs as vLLM does and publishes; returns the decoded
        published batch (None when nothing was published)."""
        scheduled = []
        for req, ids in new:
            matched, _ = self.sched.get_num_new_matched_tokens(req, 0)
            self.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), matched)
            scheduled.append((req, ids, matched, req.num_tokens - matched))
        meta = self.sched.build_connector_meta(fk.new_step(new=scheduled))
        outputs = []
        for rank, (worker, caches) in enumerate(zip(self.workers, self.caches)):
            todo = [(ids[i], fk.hashlib.sha256(bytes(h) + bytes([rank])).digest())
                    for req, ids in new for i, h in enumerate(req.block_hashes)] \
                if compute else []
            fk.run_worker_step(worker, meta, caches, LAYOUT, todo, keep_bound=True)
            outputs.append(fk.worker_output(worker))
            worker.clear_connector_metadata()
        merged = fk.KVOutputAggregator.from_connector(self.workers[0], len(self.workers))
        out = merged.aggregate(outputs)
        batch, payload = fk.publish_events(self.sched, out)
        if batch is None:
            return None
        decoded = msgpack.unpackb(payload, raw=False)
        assert decoded["events"] == fk.compat.to_builtins(batch.events)
        return decoded

    def key(self, block_hash, layer=0, rank=0):
        return self.workers[0].block_key(bytes(block_hash).hex(), layer, tp_rank=rank)

    def close(self):
        self.sched.shutdown()
        for w in self.workers:
            w.shutdown()


def stored(batch, medium=MEDIUM_MEMORY):
    return [e for e in (batch or {}).get("events", [])
            if e["type"] == "BlockStored" and e["medium"] == medium]


def removed(batch, medium):
    return [e["block_hashes"][0] for e in (batch or {}).get("events", [])
            if e["type"] == "BlockRemoved" and e["medium"] == medium]


def tokens(n, seed=0):
    return [(seed * 7919 + i * 31) % 32000 for i in range(n)]


def ext(h):
    return external_hash(bytes(h).hex())


@pytest.mark.parametrize("tp", [1, 2])
def test_saved_blocks_are_announced_once_with_their_chain(db_path, tp):
    inst = Instance(db_path, tp=tp)
    try:
        req = fk.Request("r1", tokens(3 * BS + 5), BS, inst.none_hash)
        batch = inst.step(new=[(req, [4, 5, 6, 7])])
        events = stored(batch)
        assert [e["block_hashes"] for e in events] == [[ext(h)] for h in req.block_hashes]
        assert events[0]["parent_block_hash"] is None
        assert [e["parent_block_hash"] for e in events[1:]] == \
            [ext(h) for h in req.block_hashes[:-1]]
        assert events[1]["token_ids"] == req.prompt_token_ids[BS:2 * BS]
        assert all(e["block_size"] == BS and e["lora_id"] is None for e in events)
        # msgspec's shape: a tagged map, defaults left out.
        assert "extra_keys" not in events[0] and "group_idx" not in events[0]
        assert isinstance(events[0]["block_hashes"][0], int)
        assert events[0]["block_hashes"][0] == \
            int.from_bytes(bytes(req.block_hashes[0]), "big") & (2 ** 64 - 1)
        # A step with nothing new publishes nothing; every rank still returned an object.
        assert inst.step() is None
        assert all(fk.worker_output(w).kv_connector_output.kv_cache_events is not None
                   for w in inst.workers)
    finally:
        inst.close()


def test_a_lora_requests_blocks_are_announced_with_its_adapter(db_path):
    """vLLM's BlockStored names the request's LoRA adapter (lora_id, lora_name), as its
    own block pool does; a salted request's blocks, under their own keys, announce too."""
    inst = Instance(db_path)
    try:
        lora = fk.LoRARequest("sql-lora", 7, "/loras/sql")
        req = fk.Request("r1", tokens(2 * BS), BS, inst.none_hash, lora_request=lora,
                         cache_salt="tenant-1")
        events = stored(inst.step(new=[(req, [4, 5])]))
        assert [e["block_hashes"] for e in events] == [[ext(h)] for h in req.block_hashes]
        assert all(e["lora_id"] == 7 and e["lora_name"] == "sql-lora" for e in events)
    finally:
        inst.close()


@pytest.mark.parametrize("tp", [1, 2])
def test_deleted_block_of_any_rank_is_removed_from_memory(db_path, tp):
    inst = Instance(db_path, tp=tp)
    try:
        req = fk.Request("r1", tokens(2 * BS + 1), BS, inst.none_hash)
        inst.step(new=[(req, [1, 2])])
        # One layer of one rank's block 1 is deleted: the instance cannot load the block.
        assert inst.db.remove(inst.key(req.block_hashes[1], layer=2, rank=tp - 1)) == 0
        batch = inst.step()
        assert removed(batch, MEDIUM_MEMORY) == [ext(req.block_hashes[1])]
        assert removed(batch, MEDIUM_SSD) == []
        # reset_cache removes the rest: announced once per block (AllBlocksCleared has no
        # medium, so a cleared tier is BlockRemoved events).
        assert inst.sched.reset_cache() is True
        assert removed(inst.step(), MEDIUM_MEMORY) == [ext(req.block_hashes[0])]
    finally:
        inst.close()


@pytest.mark.parametrize("tp", [1, 2])
def test_a_router_that_restarts_gets_the_stores_blocks_replayed(db_path, tp):
    """request_resync: the store's blocks of this instance come again as BlockStored (by
    hash: the key holds no tokens or parent), and a replayed block's removal is
    announced (docs/observability.md, "Resync after a restart")."""
    inst = Instance(db_path, tp=tp)
    try:
        req = fk.Request("r1", tokens(3 * BS + 1), BS, inst.none_hash)
        inst.step(new=[(req, [1, 2, 3])])
        assert inst.db.put("someone-else/L0/ab", b"x") == 0  # not this instance's
        inst.sched.request_resync()
        replay = stored(inst.step())
        assert sorted(e["block_hashes"][0] for e in replay) == \
            sorted(ext(h) for h in req.block_hashes)
        assert all(e["block_size"] == BS and e["token_ids"] == [] and
                   e["parent_block_hash"] is None for e in replay)
        assert inst.db.remove(inst.key(req.block_hashes[0], layer=0, rank=0)) == 0
        assert ext(req.block_hashes[0]) in removed(inst.step(), MEDIUM_MEMORY)
        assert inst.step() is None  # nothing more to tell
    finally:
        inst.close()


@pytest.mark.parametrize("tp", [1, 2])
def test_eviction_moves_blocks_to_ssd_then_ssd_eviction_removes_them(db_path, tp):
    # Memory for 128 values of a block's layer; the SSD tier evicts too.
    inst = Instance(db_path, tp=tp, memory_capacity_bytes="256KiB",
                    memory_slab_size="64KiB", ssd_capacity_bytes="2MiB",
                    bucket_size_limit="256KiB", ssd_eviction="fifo", gc_interval_ms=0)
    try:
        req = fk.Request("r1", tokens(2 * BS + 1), BS, inst.none_hash)
        inst.step(new=[(req, [1, 2])])
        # Other traffic of the same size fills memory: the blocks leave it for SSD.
        filler = bytes(VALUE)
        for i in range(200):
            assert inst.db.put("filler/%d" % i, filler) == 0
        batch = inst.step()
        assert sorted(removed(batch, MEDIUM_MEMORY)) == sorted(ext(h) for h in req.block_hashes)
        assert sorted(e["block_hashes"][0] for e in stored(batch, MEDIUM_SSD)) == \
            sorted(ext(h) for h in req.block_hashes)
        # Enough traffic through SSD evicts them there too.
        for i in range(200, 1400):
            assert inst.db.put("filler/%d" % i, filler) == 0
        assert inst.db.flush() == 0
        assert sorted(removed(inst.step(), MEDIUM_SSD)) == \
            sorted(ext(h) for h in req.block_hashes)
    finally:
        inst.close()


class FailingPuts:
    """A rank's store whose puts fail (the rest is the real store)."""

    def __init__(self, db):
        self._db = db

    def __getattr__(self, name):
        if name.startswith("batch_put"):
            return lambda keys, *rest: [-4] * len(keys)
        return getattr(self._db, name)


def test_a_block_one_rank_failed_to_save_is_not_announced(db_path):
    inst = Instance(db_path, tp=2)
    try:
        inst.workers[1].connector_worker._db = FailingPuts(inst.workers[1]._db)
        req = fk.Request("r1", tokens(BS + 1), BS, inst.none_hash)
        assert inst.step(new=[(req, [3])]) is None  # rank 0's BlockStored alone: held back
    finally:
        inst.close()


def test_events_off_returns_no_events_object(db_path):
    inst = Instance(db_path, tp=1, events=False)
    try:
        req = fk.Request("r1", tokens(BS + 1), BS, inst.none_hash)
        assert inst.step(new=[(req, [3])]) is None
        assert inst.workers[0].get_kv_connector_kv_cache_events() is None
    finally:
        inst.close()


def test_event_classes_match_vllms_shapes():
    a = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2,
                    lora_id=None, medium=MEDIUM_SSD, lora_name=None)
    assert a == BlockStored([1], None, [1, 2], 2, None, MEDIUM_SSD, None)
    assert hash(a) == hash(BlockStored([1], None, [1, 2], 2, None, MEDIUM_SSD, None))
    assert fk.compat.to_builtins(BlockRemoved(block_hashes=[7], medium=MEDIUM_MEMORY)) == \
        {"type": "BlockRemoved", "block_hashes": [7], "medium": MEDIUM_MEMORY}
    with pytest.raises(TypeError):
        BlockRemoved(block_hashes=[7])  # medium has no default
