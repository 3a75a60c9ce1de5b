"""Layer-by-layer loads of KVEngineConnector: time from start_load_kv to the first layer
ready (wait_for_layer_load of layer 0 returns) and to every layer, for 32 layers x 1 MiB
per block and layer (today's FlashAttention layout, NHD, bf16), CPU caches.

    PYTHONPATH=build/python:test/python PYTHONHASHSEED=0 /usr/bin/python3 \
        python/bench/bench_vllm_layers.py [--blocks 8] [--repeat 5]

It uses the project's vLLM stand-in (test/python/vllm_fakes.py) to drive the connector.
"""
import argparse
import statistics
import tempfile
import time

import torch

import vllm_fakes as fk
from kvengine.vllm.connector import KVEngineConnector
from kvengine.vllm._vllm_compat import KVConnectorRole

LAYERS, BLOCK_SIZE, HEADS, HEAD_SIZE = 32, 16, 32, 512  # 16*32*1024*2 bytes = 1 MiB


def instance(path, num_blocks):
    cfg = fk.make_config(path, block_size=BLOCK_SIZE, dtype=torch.bfloat16, policy="recompute",
                         options=dict(memory_capacity_bytes="2GiB", prefault_memory=False))
    sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KVEngineConnector(cfg, KVConnectorRole.WORKER)
    caches = fk.make_caches("flash_nhd", num_layers=LAYERS, num_blocks=num_blocks,
                            block_size=BLOCK_SIZE, heads=HEADS, head_size=HEAD_SIZE,
                            dtype=torch.bfloat16)
    worker.register_kv_caches(caches)
    return sched, worker, caches


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.blocks
    with tempfile.TemporaryDirectory() as tmp:
        none_hash = fk.init_none_hash()
        sa, wa, ca = instance(tmp + "/db", n)
        sb, wb, cb = instance(tmp + "/db", n)
        tokens = list(range(n * BLOCK_SIZE + 1))
        req = fk.Request("a", tokens, BLOCK_SIZE, none_hash)
        sa.get_num_new_matched_tokens(req, 0)
        sa.update_state_after_alloc(req, fk.KVCacheBlocks(range(n)), 0)
        meta = sa.build_connector_meta(fk.new_step(new=[(req, range(n), 0, len(tokens))]))
        fk.run_worker_step(wa, meta, ca, "flash_nhd",
                           compute=[(i, h) for i, h in enumerate(req.block_hashes)])
        names = list(cb)
        first, last = [], []
        for r in range(args.repeat):
            reqb = fk.Request("b%d" % r, tokens, BLOCK_SIZE, none_hash)
            matched, _ = sb.get_num_new_matched_tokens(reqb, 0)
            sb.update_state_after_alloc(reqb, fk.KVCacheBlocks(range(n)), matched)
            meta = sb.build_connector_meta(fk.new_step(new=[(reqb, range(n), matched, 1)]))
            wb.bind_connector_metadata(meta)
            t0 = time.perf_counter()
            wb.start_load_kv(fk.Forward())
            wb.wait_for_layer_load(names[0])
            t1 = time.perf_counter()
            for name in names:
                wb.wait_for_layer_load(name)
            t2 = time.perf_counter()
            wb.wait_for_save()
            wb.clear_connector_metadata()
            assert wb.get_block_ids_with_load_errors() == set()
            first.append(t1 - t0)
            last.append(t2 - t0)
        total = LAYERS * n * (1 << 20)
        print("%d layers x %d blocks x 1 MiB = %d MiB per load, %d runs (median):"
              % (LAYERS, n, total >> 20, args.repeat))
        print("  start_load_kv -> layer 0 ready:  %.2f ms" % (statistics.median(first) * 1e3))
        print("  start_load_kv -> all layers:     %.2f ms (%.1f GiB/s)"
              % (statistics.median(last) * 1e3, total / statistics.median(last) / (1 << 30)))
        for c in (sa, wa, sb, wb):
            c.shutdown()


if __name__ == "__main__":
    main()
