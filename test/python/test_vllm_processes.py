"""The vLLM connector across real processes sharing one store (docs/vllm.md, "One store
per host"): two tensor-parallel-2 instances, each a scheduler process and two worker
processes with their own connectors (spawned, as vLLM's are).  The first process to open
the path owns the store and serves the others; a block saved by one instance loads
bit-exact into the other; when the owning instance exits, the other takes the store over
and still loads what was saved."""
import multiprocessing
import pickle
import time

import pytest
import torch

import vllm_fakes as fk
import vllm_process as vp
from spawned import Spawned
from kvengine.vllm.connector import default_socket



def Process(ctx, *args):
    """One spawned vLLM process (vllm_process.main), answering commands over a pipe."""
    return Spawned(ctx, vp.main, *args)


class Instance:
    """A tensor-parallel-2 vLLM instance: scheduler process, worker processes 0 and 1."""

    def __init__(self, ctx, path, engine_id, events=False):
        self.scheduler = Process(ctx, "scheduler", path, 2, engine_id, None, events)
        self.workers = [Process(ctx, "worker", path, 2, engine_id, r, events)
                        for r in range(2)]

    def processes(self):
        return [self.scheduler] + self.workers

    def run(self, req_id, tokens, block_ids, none_hash, compute):
        """Schedules a new request and runs its step on both workers: matched tokens."""
        matched, meta = self.scheduler("schedule", req_id, tokens, block_ids, none_hash)
        for w in self.workers:
            assert w("step", meta, compute) == []  # no load errors
        return matched

    def blocks(self, block_ids):
        return [w("blocks", block_ids) for w in self.workers]  # [rank][block][layer]

    def close(self):
        for p in reversed(self.processes()):  # workers first, as vLLM shuts down
            p.close()


def same(blocks_a, blocks_b):
    return all(torch.equal(x, y) for ra, rb in zip(blocks_a, blocks_b)
               for ba, bb in zip(ra, rb) for x, y in zip(ba, bb))


def test_tensor_parallel_instances_in_separate_processes_share_one_store(db_path):
    ctx = multiprocessing.get_context("spawn")
    none_hash = fk._sha256("0")  # PYTHONHASHSEED=0 in every engine process
    tokens = [(i * 31) % 32000 for i in range(4 * vp.BS + 3)]  # 4 full blocks
    hashes = fk.block_hashes(tokens, vp.BS, none_hash)
    socket = default_socket(db_path)
    a = b = None
    try:
        a = Instance(ctx, db_path, "A")
        assert a.scheduler("attached") is None  # the first process owns the store
        assert [w("attached") for w in a.workers] == [socket, socket]
        b = Instance(ctx, db_path, "B")
        assert all(p("attached") == socket for p in b.processes())

        ids_a = [5, 2, 9, 7, 1]
        assert a.run("ra", tokens, ids_a, none_hash, list(zip(ids_a, hashes))) == 0
        saved = a.blocks(ids_a[:4])
        assert not same(saved, [[[torch.zeros_like(x) for x in blk] for blk in rank]
                                for rank in saved])

        ids_b = [3, 11, 0, 6, 8]
        assert b.run("rb", tokens, ids_b, none_hash, []) == 4 * vp.BS
        assert same(b.blocks(ids_b[:4]), saved)

        # The owner's instance exits (its store flushed at close); B's next calls find
        # the owner gone and one of its processes takes the store over.
        a.close()
        a = None
        ids_c = [12, 13, 14, 15, 4]
        assert b.run("rc", tokens, ids_c, none_hash, []) == 4 * vp.BS
        assert same(b.blocks(ids_c[:4]), saved)
        owners = [p("attached") for p in b.processes()].count(None)
        assert owners == 1
    finally:
        for inst in (a, b):
            if inst is not None:
                inst.close()


def test_connectors_attach_to_a_server_socket(db_path):
    """Deployment (a): every connector names the socket of a process that owns the store
    (here this one, standing in for kv_server --local_listen); they save and load through
    it, and the owner sees the blocks."""
    import kvengine
    from kvengine.vllm._vllm_compat import KVConnectorRole
    from kvengine.vllm.connector import KVEngineConnector

    sock = default_socket(db_path)
    with kvengine.DB(db_path, local_listen=sock, memory_capacity_bytes="64MiB",
                     prefault_memory=False, apply_environment=False) as owner:
        none_hash = fk._sha256("0")
        tokens = [(i * 7) % 32000 for i in range(2 * vp.BS + 3)]
        instances = []
        for engine_id in ("A", "B"):
            cfg = fk.make_config("", block_size=vp.BS, attach=sock, engine_id=engine_id)
            sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
            worker = KVEngineConnector(cfg, KVConnectorRole.WORKER)
            caches = fk.make_caches(vp.LAYOUT, block_size=vp.BS)
            worker.register_kv_caches(caches)
            instances.append((sched, worker, caches))
        try:
            assert instances[0][0]._db.attached == sock
            for (sched, worker, caches), ids, compute in (
                    (instances[0], [1, 2, 3], True), (instances[1], [4, 5, 6], False)):
                req = fk.Request("r" + str(ids[0]), tokens, vp.BS, none_hash)
                matched, _ = sched.get_num_new_matched_tokens(req, 0)
                assert matched == (0 if compute else 2 * vp.BS)
                sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), matched)
                meta = sched.build_connector_meta(
                    fk.new_step(new=[(req, ids, matched, req.num_tokens - matched)]))
                fk.run_worker_step(worker, meta, caches, vp.LAYOUT,
                                   list(zip(ids, req.block_hashes)) if compute else ())
            (_, _, ca), (_, _, cb) = instances
            for a_id, b_id in ((1, 4), (2, 5)):
                for x, y in zip(ca.values(), cb.values()):
                    assert torch.equal(fk.block_view(x, vp.LAYOUT, a_id),
                                       fk.block_view(y, vp.LAYOUT, b_id))
            assert owner.stats()["memory"]["items"] >= 2 * 3  # blocks x layers, + layouts
        finally:
            for sched, worker, _ in instances:
                sched.shutdown()
                worker.shutdown()


def test_kv_events_of_a_tensor_parallel_2_instance_across_processes(db_path):
    """vLLM's event path across real processes: each worker process returns its output
    (pickled, as vLLM's executor ships it), vLLM's KVOutputAggregator merges them, the
    scheduler process's connector publishes what both ranks reported, encoded as vLLM's
    publisher encodes it."""
    msgpack = pytest.importorskip(
        "msgpack", reason="msgpack is not installed (Debian: apt-get install python3-msgpack)")
    from kvengine.vllm.events import MEDIUM_MEMORY, external_hash

    ctx = multiprocessing.get_context("spawn")
    none_hash = fk._sha256("0")
    tokens = [(i * 17) % 32000 for i in range(2 * vp.BS + 3)]
    hashes = fk.block_hashes(tokens, vp.BS, none_hash)
    inst = Instance(ctx, db_path, "A", events=True)

    def step(meta, compute=()):
        outputs = [pickle.loads(w("step_output", meta, compute)) for w in inst.workers]
        merged = fk.KVOutputAggregator(2).aggregate(outputs)
        payload = inst.scheduler("publish", pickle.dumps(merged))
        return msgpack.unpackb(payload, raw=False) if payload else None

    try:
        ids = [3, 4, 5]
        _, meta = inst.scheduler("schedule", "r1", tokens, ids, none_hash)
        batch = step(meta, list(zip(ids, hashes)))
        events = batch["events"]
        assert [(e["type"], e["block_hashes"], e["medium"]) for e in events] == \
            [("BlockStored", [external_hash(bytes(h).hex())], MEDIUM_MEMORY) for h in hashes]
        assert events[1]["parent_block_hash"] == external_hash(bytes(hashes[0]).hex())
        assert step(inst.scheduler("idle")) is None  # nothing new: nothing published
        assert inst.workers[1]("remove_block", hashes[0], 1) == 0
        batch = step(inst.scheduler("idle"))
        assert [(e["type"], e["block_hashes"], e["medium"]) for e in batch["events"]] == \
            [("BlockRemoved", [external_hash(bytes(hashes[0]).hex())], MEDIUM_MEMORY)]
    finally:
        inst.close()
