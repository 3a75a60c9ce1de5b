#!/usr/bin/env python3
"""LMCache's chunk shape through kvengine's native plug-in vs memcpy of the same bytes.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_lmcache.py
        [--chunks 8] [--layers 32] [--tokens 256] [--kv-dim 1024] [--iterations 5]
        [--modes inproc,inproc-register,attached] [--batches 1] [--workers 4] [--part-mib 64]

A chunk is what LMCache stores per key: K and V of every layer for 256 tokens, bf16
(2 x layers x tokens x kv_dim x 2 bytes; 32 MiB for a 32-layer model with 8 KV heads of
128, e.g. Llama-3.1-8B).  The L1 buffers are ctypes-backed memoryviews, as LMCache's
MemoryObj.byte_array.  Each round stores the chunks (submit_batch_set) and loads them
back into other buffers (submit_batch_get), split into --batches batches submitted at
once, waiting on the plug-in's eventfd and draining, as LMCache's adapter does.  In the
same run and on the same buffers, the baseline is one memcpy (ctypes.memmove) per chunk
into a destination of the same size.  Each figure is the best of --iterations rounds,
by wall time and by the process's CPU time (the copying threads' work, which a loaded
machine distorts much less).

Modes: inproc (this process owns the store), inproc-register (the same, registering
each buffer on first sight), attached (the store is owned by a DB in this process
serving local_listen, and the plug-in attaches to its socket: the copy goes through the
shared arena, as for every LMCache process but the first).
"""
import argparse
import ctypes
import os
import select
import shutil
import tempfile
import time

import kvengine
from kvengine.lmcache import KVEngineL2Plugin


def l1_pool(n, size, fill):
    """n memoryviews of size bytes over one ctypes allocation (LMCache's L1 arena)."""
    pool = (ctypes.c_ubyte * (n * size))()
    ctypes.memset(pool, fill, n * size)
    base = ctypes.addressof(pool)
    views = [memoryview((ctypes.c_ubyte * size).from_address(base + i * size)).cast("B")
             for i in range(n)]
    return pool, views


def run_batches(plugin, submit, keys, views, batches):
    step = (len(keys) + batches - 1) // batches
    pending = set()
    for i in range(0, len(keys), step):
        pending.add(submit(keys[i:i + step], views[i:i + step]))
    failures = 0
    while pending:
        select.select([plugin.event_fd()], [], [], 1.0)
        for fid, ok, error, bools in plugin.drain_completions():
            pending.discard(fid)
            if not ok:
                failures += 1
                print("  failed: %s" % error)
    return failures


def timed(fn):
    """(wall seconds, CPU seconds of the whole process) of fn().  While the plug-in
    works, this thread sleeps in select(), so the CPU time is the workers' copying; on a
    shared, loaded machine it moves far less than the wall time does."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def bench_mode(mode, args, keys, src, dst, chunk, memcpy_round):
    """Best (wall, CPU) seconds of (plug-in set, memcpy src->dst, plug-in get, memcpy
    dst->src), the four timed in turn in every round so that both see the same machine."""
    path = tempfile.mkdtemp(prefix="kv_lmcache_bench_")
    cap = "%dMiB" % (3 * len(keys) * chunk // (1 << 20) + 64)
    options = dict(memory_capacity_bytes=cap, apply_environment=False)
    owner = None
    try:
        if mode == "attached":
            sock = os.path.join(path, "owner.sock")
            owner = kvengine.DB(os.path.join(path, "db"), local_listen=sock, **options)
            plugin = KVEngineL2Plugin(attach=sock, num_workers=args.workers,
                                      part_bytes=args.part_mib << 20)
        else:
            plugin = KVEngineL2Plugin(path=os.path.join(path, "db"), num_workers=args.workers,
                                      part_bytes=args.part_mib << 20,
                                      register_buffers=mode == "inproc-register", **options)
        try:
            failed = [0]

            def store():
                failed[0] += run_batches(plugin, plugin.submit_batch_set, keys, src, args.batches)

            def load():
                failed[0] += run_batches(plugin, plugin.submit_batch_get, keys, dst, args.batches)

            store()
            load()
            assert all(bytes(s[:4096]) == bytes(d[:4096]) for s, d in zip(src, dst))
            best = [(float("inf"), float("inf"))] * 4
            for _ in range(args.iterations):
                t = (timed(store), timed(lambda: memcpy_round(src, dst)), timed(load),
                     timed(lambda: memcpy_round(dst, src)))
                best = [(min(b[0], x[0]), min(b[1], x[1])) for b, x in zip(best, t)]
            return best, failed[0]
        finally:
            plugin.close()
    finally:
        if owner is not None:
            owner.close()
        shutil.rmtree(path, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--kv-dim", type=int, default=1024, help="KV heads x head size")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--batches", type=int, default=1, help="batches per round, submitted at once")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--part-mib", type=int, default=64, help="the plug-in's part_bytes, MiB")
    ap.add_argument("--modes", default="inproc,inproc-register,attached")
    args = ap.parse_args()

    chunk = 2 * args.layers * args.tokens * args.kv_dim * 2  # K and V, bf16
    nbytes = args.chunks * chunk
    keys = ["meta-llama/Llama-3.1-8B@%08x@0@%032x" % (0x01000100, i) for i in range(args.chunks)]
    _src_pool, src = l1_pool(args.chunks, chunk, 0x11)
    for i, v in enumerate(src):  # distinct bytes per chunk
        v[:64] = os.urandom(64)
        v[-64:] = bytes([i % 256]) * 64
    _dst_pool, dst = l1_pool(args.chunks, chunk, 0x22)
    print("chunk %.1f MiB (%d layers x %d tokens x %d x bf16 x K,V), %d chunks, %d batch(es), "
          "%d workers, parts of <= %d MiB" % (chunk / (1 << 20), args.layers, args.tokens,
                                              args.kv_dim, args.chunks, args.batches,
                                              args.workers, args.part_mib))

    def memcpy_round(a, b):
        for s, d in zip(a, b):
            ctypes.memmove(ctypes.addressof(ctypes.c_ubyte.from_buffer(d)),
                           ctypes.addressof(ctypes.c_ubyte.from_buffer(s)), chunk)

    for mode in args.modes.split(","):
        (set_s, copy_out, get_s, copy_in), failures = bench_mode(mode, args, keys, src, dst,
                                                                 chunk, memcpy_round)
        for op, secs, base in (("set", set_s, copy_out), ("get", get_s, copy_in)):
            print("%-16s %s  plug-in %6.2f GB/s  memcpy %6.2f GB/s  ratio %.2f  "
                  "(CPU time: plug-in %6.2f GB/s, memcpy %6.2f GB/s, ratio %.2f)%s" % (
                      mode, op, nbytes / secs[0] / 1e9, nbytes / base[0] / 1e9,
                      base[0] / secs[0], nbytes / secs[1] / 1e9, nbytes / base[1] / 1e9,
                      base[1] / secs[1],
                      "  (%d failed batches)" % failures if failures else ""))


if __name__ == "__main__":
    main()
