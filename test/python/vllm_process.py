"""One vLLM process of a multi-process instance, for test_vllm_processes.py: a scheduler
process or one tensor-parallel worker process, each with its own KVEngineConnector,
driven over a multiprocessing pipe.  Started with the 'spawn' method, so each is a fresh
interpreter that opens (or attaches to) the store by itself, as vLLM's processes do."""
import hashlib
import os
import pickle
import traceback

import torch

import vllm_fakes as fk

BS = 16
LAYOUT = "flash_nhd"


def config(path, tp_size, engine_id, tp_rank=None, events=False, attach=None, role="kv_both",
           policy="fail"):
    extra = dict(engine_id=engine_id, role=role, policy=policy,
                 options=dict(memory_capacity_bytes="64MiB", prefault_memory=False,
                              ssd_capacity_bytes="256MiB", apply_environment=False))
    if tp_rank is not None:
        extra["tp_rank"] = tp_rank
    if attach is not None:  # deployment (a): a kv_server's socket
        extra["attach"] = attach
    cfg = fk.make_config(path, block_size=BS, **extra)
    cfg.parallel_config.tensor_parallel_size = tp_size
    cfg.kv_events_config = fk.KVEventsConfig(enable_kv_cache_events=events)
    return cfg


def rank_hash(block_hash, rank):
    """What a rank 'computes' for a block: different bytes per rank, so that a load from
    another rank's keys would show."""
    return hashlib.sha256(bytes(block_hash) + bytes([rank])).digest()


def main(conn, role, path, tp_size, engine_id, tp_rank=None, events=False, attach=None,
         kv_role="kv_both", policy="fail"):
    """role: "scheduler" or "worker"; kv_role and policy: kv_transfer_config's kv_role and
    kv_load_failure_policy."""
    try:
        from kvengine.vllm._vllm_compat import KVConnectorRole
        from kvengine.vllm.connector import KVEngineConnector

        if role == "scheduler":
            connector = KVEngineConnector(
                config(path, tp_size, engine_id, events=events, attach=attach, role=kv_role,
                       policy=policy),
                KVConnectorRole.SCHEDULER)
            caches = None
        else:
            connector = KVEngineConnector(config(path, tp_size, engine_id, tp_rank, events, attach,
                                                 kv_role, policy),
                                          KVConnectorRole.WORKER)
            caches = fk.make_caches(LAYOUT, block_size=BS)
            connector.register_kv_caches(caches)
        conn.send(("ready", os.getpid()))
        while True:
            command, args = conn.recv()
            if command == "close":
                connector.shutdown()
                conn.send(("ok", None))
                return
            if command == "attached":  # the socket this process attached through, or None
                conn.send(("ok", connector._db.attached))
            elif command == "schedule":  # a new request: (matched tokens, metadata)
                req_id, tokens, block_ids, none_hash = args
                req = fk.Request(req_id, tokens, BS, none_hash)
                matched, _ = connector.get_num_new_matched_tokens(req, 0)
                connector.update_state_after_alloc(req, fk.KVCacheBlocks(block_ids), matched)
                out = fk.new_step(new=[(req, block_ids, matched, req.num_tokens - matched)])
                meta = connector.build_connector_meta(out)
                conn.send(("ok", (matched, pickle.dumps(meta))))
            elif command == "step":  # one forward pass: loads, computes, saves
                meta, compute = args
                compute = [(b, rank_hash(h, tp_rank)) for b, h in compute]
                fk.run_worker_step(connector, pickle.loads(meta), caches, LAYOUT, compute)
                conn.send(("ok", sorted(connector.get_block_ids_with_load_errors())))
            elif command == "idle":  # a step that schedules nothing: its metadata
                meta = connector.build_connector_meta(fk.new_step())
                conn.send(("ok", pickle.dumps(meta)))
            elif command == "step_output":  # a step, then the output vLLM collects (pickled)
                meta, compute = args
                compute = [(b, rank_hash(h, tp_rank)) for b, h in compute]
                fk.run_worker_step(connector, pickle.loads(meta), caches, LAYOUT, compute,
                                   keep_bound=True)
                out = fk.worker_output(connector)
                connector.clear_connector_metadata()
                conn.send(("ok", pickle.dumps(out)))
            elif command == "publish":  # the merged output: the published payload (msgpack)
                _, payload = fk.publish_events(connector, pickle.loads(args[0]))
                conn.send(("ok", payload))
            elif command == "remove_block":  # deletes one layer of a block of this rank
                block_hash, layer = args
                conn.send(("ok", connector._db.remove(
                    connector.block_key(bytes(block_hash).hex(), layer))))
            elif command == "keys":  # this rank's keys of these blocks, every layer
                conn.send(("ok", [connector.block_key(bytes(h).hex(), layer)
                                  for h in args[0] for layer in range(len(caches))]))
            elif command == "blocks":  # the bytes of these blocks, every layer
                conn.send(("ok", [[fk.block_view(c, LAYOUT, b).contiguous().view(torch.uint8)
                                   for c in caches.values()] for b in args]))
            else:
                conn.send(("error", "unknown command %r" % command))
    except Exception:  # noqa: BLE001 -- reported to the test
        conn.send(("error", traceback.format_exc()))
