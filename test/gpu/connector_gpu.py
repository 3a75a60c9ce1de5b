"""The vLLM connector's save/load round trip on CUDA KV caches, with its timings beside
torch's own copies of the same bytes (cudaMemcpyAsync between the device and pinned host
memory) in the same run.

    PYTHONPATH=build-gpu/python:test/python PYTHONHASHSEED=0 /usr/bin/python3 \\
        test/gpu/connector_gpu.py [--blocks 8] [--repeat 5]

32 layers x 1 MiB per block and layer (today's FlashAttention layout, NHD, bf16).  Instance
A computes and saves the blocks from its CUDA caches; instance B loads them into zeroed
CUDA caches at other block ids, layer by layer; every byte is compared.  Exits 77 (skip)
without a usable GPU or a CUDA build of kvengine; never prints figures it did not measure.
test/gpu/run.sh runs it.
"""
import argparse
import statistics
import sys
import tempfile
import time

try:
    import torch
except ImportError:
    print("SKIP: torch is not installed")
    sys.exit(77)

import kvengine

if not torch.cuda.is_available():
    print("SKIP: torch sees no CUDA device")
    sys.exit(77)
if not kvengine.CUDA_BUILD:
    print("SKIP: this kvengine was built without CUDA")
    sys.exit(77)

import vllm_fakes as fk  # noqa: E402
from kvengine.vllm._vllm_compat import KVConnectorRole  # noqa: E402
from kvengine.vllm.connector import KVEngineConnector  # noqa: E402

LAYERS, BLOCK_SIZE, HEADS, HEAD_SIZE = 32, 16, 32, 512  # 16*32*1024*2 bytes = 1 MiB
LAYOUT = "flash_nhd"


def instance(path, num_blocks):
    cfg = fk.make_config(path, block_size=BLOCK_SIZE, dtype=torch.bfloat16, policy="recompute",
                         options=dict(memory_capacity_bytes="4GiB", prefault_memory=False))
    sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KVEngineConnector(cfg, KVConnectorRole.WORKER)
    host = fk.make_caches(LAYOUT, num_layers=LAYERS, num_blocks=num_blocks,
                          block_size=BLOCK_SIZE, heads=HEADS, head_size=HEAD_SIZE,
                          dtype=torch.bfloat16)
    caches = {name: t.cuda() for name, t in host.items()}  # keeps the NHD strides
    worker.register_kv_caches(caches)
    return sched, worker, caches


def copy_baseline(caches, blocks, repeat):
    """Seconds for torch to copy the same blocks device -> pinned host and back, one
    cudaMemcpyAsync per block and layer, as the connector moves them."""
    pinned = [torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True) for _ in blocks]
    d2h, h2d = [], []
    for _ in range(repeat):
        for direction, out in (("d2h", d2h), ("h2d", h2d)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for cache in caches.values():
                for i, b in enumerate(blocks):
                    dev = fk.block_view(cache, LAYOUT, b).contiguous().view(torch.uint8)
                    if direction == "d2h":
                        pinned[i].copy_(dev.flatten(), non_blocking=True)
                    else:
                        dev.flatten().copy_(pinned[i], non_blocking=True)
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
    return statistics.median(d2h), statistics.median(h2d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.blocks
    with tempfile.TemporaryDirectory() as tmp:
        none_hash = fk.init_none_hash()
        sa, wa, ca = instance(tmp + "/db", 2 * n)
        sb, wb, cb = instance(tmp + "/db", 2 * n)
        tokens = list(range(n * BLOCK_SIZE + 1))
        ids_a, ids_b = list(range(n)), list(range(n, 2 * n))

        req = fk.Request("a", tokens, BLOCK_SIZE, none_hash)
        sa.get_num_new_matched_tokens(req, 0)
        sa.update_state_after_alloc(req, fk.KVCacheBlocks(ids_a), 0)
        meta = sa.build_connector_meta(fk.new_step(new=[(req, ids_a, 0, len(tokens))]))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fk.run_worker_step(wa, meta, ca, LAYOUT,
                           compute=[(i, h) for i, h in zip(ids_a, req.block_hashes)])
        save_seconds = time.perf_counter() - t0  # includes 'computing' the blocks

        names = list(cb)
        first, last = [], []
        for r in range(args.repeat):
            for cache in cb.values():
                cache.zero_()
            reqb = fk.Request("b%d" % r, tokens, BLOCK_SIZE, none_hash)
            matched, _ = sb.get_num_new_matched_tokens(reqb, 0)
            assert matched == n * BLOCK_SIZE, matched
            sb.update_state_after_alloc(reqb, fk.KVCacheBlocks(ids_b), matched)
            meta = sb.build_connector_meta(fk.new_step(new=[(reqb, ids_b, matched, 1)]))
            wb.bind_connector_metadata(meta)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            wb.start_load_kv(fk.Forward())
            wb.wait_for_layer_load(names[0])
            t1 = time.perf_counter()
            for name in names:
                wb.wait_for_layer_load(name)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            wb.wait_for_save()
            wb.clear_connector_metadata()
            assert wb.get_block_ids_with_load_errors() == set()
            first.append(t1 - t0)
            last.append(t2 - t0)
            for name in names:
                for a, b in zip(ids_a, ids_b):
                    x = fk.block_view(ca[name], LAYOUT, a).contiguous().view(torch.uint8)
                    y = fk.block_view(cb[name], LAYOUT, b).contiguous().view(torch.uint8)
                    assert torch.equal(x, y), "layer %s block %d differs" % (name, b)

        d2h, h2d = copy_baseline(ca, ids_a, args.repeat)
        total = LAYERS * n * (1 << 20)
        load = statistics.median(last)
        print("connector on CUDA caches, %d layers x %d blocks x 1 MiB = %d MiB, bit-exact"
              % (LAYERS, n, total >> 20))
        print("  save (first step, incl. computing):  %.2f ms" % (save_seconds * 1e3))
        print("  load: start_load_kv -> layer 0 ready: %.2f ms" % (statistics.median(first) * 1e3))
        print("  load: start_load_kv -> all layers:    %.2f ms (%.1f GiB/s)"
              % (load * 1e3, total / load / (1 << 30)))
        print("  torch cudaMemcpyAsync, same blocks:   D2H %.2f ms, H2D %.2f ms"
              % (d2h * 1e3, h2d * 1e3))
        print("  load / H2D baseline: %.2fx of the baseline's bandwidth" % (h2d / load))
        for c in (sa, wa, sb, wb):
            c.shutdown()


if __name__ == "__main__":
    main()
