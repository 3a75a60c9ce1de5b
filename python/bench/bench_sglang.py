"""SGLang's HiCache storage path through kvengine: batch_set_v1 / batch_get_v1 of one
request's pages against memcpy of the same pages, in the same run.

    PYTHONPATH=build/python:test/python /usr/bin/python3 python/bench/bench_sglang.py \
        [--pages 32] [--repeat 5] [--layouts page_first,layer_first]

The request: a 32-layer model with 8 KV heads of 128 (per tensor-parallel rank), bf16,
64-token pages (8 MiB a page, K and V of every layer), --pages pages.  For each host
layout, the backend (kvengine.sglang.KVEngineHiCacheStorage, made by SGLang's factory
through the project's SGLang stand-in) sets the pages from one host pool and gets them
into another at other indices:

* in-process: this process owns the store (memory tier);
* attached:   another process owns the store and this one attaches (docs/attach.md),
  as every rank but one does when SGLang's ranks share a host's store.

The baseline copies the same page parts (get_page_buffer_meta's pointers and sizes)
with memcpy between the host pool and a buffer of the request's size: what a set or
a get must at least do.  The rounds interleave kvengine and memcpy (set, memcpy, get,
memcpy), so both see the same machine; a set runs on an empty store (the request's
pages are removed before each round, outside the timing).  Bandwidths are medians over
the rounds; a ratio is the median over the rounds of memcpy time / kvengine time (1.0:
as fast as memcpy).
"""
import argparse
import ctypes
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "test", "python"))
import sglang_fakes as fk  # noqa: E402

import kvengine  # noqa: E402

LAYERS, HEADS, HEAD_DIM, PAGE = 32, 8, 128, 64
STORE = dict(memory_capacity_bytes="2GiB", apply_environment=False)


def owner_process(conn, path, sock):
    """Owns the store and serves it on sock until told to stop."""
    db = kvengine.DB(path, local_listen=sock, **STORE)
    conn.send("ready")
    conn.recv()
    db.close()


def fill(pool, seed):
    g = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    step = 64 << 20
    for start in range(0, raw.numel(), step):
        part = raw[start:start + step]
        part.copy_(torch.randint(0, 256, part.shape, generator=g, dtype=torch.uint8))


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def memcpy_plan(parts, scratch):
    """(destination, source, size) of each part into consecutive bytes of scratch."""
    plan, offset = [], scratch.data_ptr()
    for ptrs, sizes in parts:
        for p, n in zip(ptrs, sizes):
            plan.append((offset, p, n))
            offset += n
    return plan


def run_memcpy(plan, reverse=False):
    for dst, src, n in plan:
        if reverse:
            ctypes.memmove(src, dst, n)
        else:
            ctypes.memmove(dst, src, n)


def pools(layout, pages):
    return fk.make_pools("mha", layout, torch.bfloat16, layers=LAYERS, heads=HEADS,
                         head_dim=HEAD_DIM, page_size=PAGE, pages=pages + 4)


def measure(store, layout, pages, repeat):
    """Per round, interleaved so that both see the same machine: kvengine set, memcpy
    set, kvengine get, memcpy get.  Returns {name: [seconds per round]} and the bytes of
    the request."""
    fk.set_parallel(0, 1)
    extra = fk.kvengine_extra_config(**store, **STORE)
    (dev, src), (_, dst) = pools(layout, pages), pools(layout, pages)
    fill(src, 1)
    dst.kv_buffer.view(-1).view(torch.uint8).fill_(0)
    # The instance that backs the pages up, and the one that prefetches them.
    writer = fk.make_controller(dev, src, extra, model_name="bench/llama-32l")
    reader = fk.make_controller(dev, dst, extra, model_name="bench/llama-32l")
    hashes = fk.get_hash_str(list(range(pages * PAGE)), None, PAGE)
    src_slots = src.alloc(pages * PAGE)
    dst.alloc(3 * PAGE)  # the get lands at other indices
    dst_slots = dst.alloc(pages * PAGE)
    keys = writer.storage_backend._keys.pages(hashes)
    store_handle = writer.storage_backend._store

    def parts(pool, slots):
        return [pool.get_page_buffer_meta(slots[i * PAGE:(i + 1) * PAGE]) for i in range(pages)]

    src_parts = parts(src, src_slots)
    nbytes = sum(sum(sizes) for _, sizes in src_parts)
    scratch = torch.empty(nbytes, dtype=torch.uint8)
    scratch.fill_(1)  # faulted in, as the store's arena is
    set_plan, get_plan = memcpy_plan(src_parts, scratch), memcpy_plan(parts(dst, dst_slots),
                                                                      scratch)
    times = {"set": [], "memcpy_set": [], "get": [], "memcpy_get": [], "discarded": 0}
    while len(times["set"]) < repeat:
        store_handle.batch_remove(keys)
        results = {}
        set_s = seconds(lambda: results.update(
            set=writer.storage_backend.batch_set_v1(hashes, src_slots)))
        mset_s = seconds(lambda: run_memcpy(set_plan))
        get_s = seconds(lambda: results.update(
            get=reader.storage_backend.batch_get_v1(hashes, dst_slots)))
        mget_s = seconds(lambda: run_memcpy(get_plan, reverse=True))
        if not (all(results["set"]) and all(results["get"])):
            # A page refused (the backend logged why: on an overloaded host an attached
            # copy can miss its reserved slot's deadline): the round does not count.
            times["discarded"] += 1
            assert times["discarded"] <= repeat, "most rounds failed"
            continue
        for name, value in (("set", set_s), ("memcpy_set", mset_s), ("get", get_s),
                            ("memcpy_get", mget_s)):
            times[name].append(value)
    for i in range(pages):
        assert fk.page_bytes(src, int(src_slots[i * PAGE])) == \
            fk.page_bytes(dst, int(dst_slots[i * PAGE])), "page %d differs" % i
    store_handle.batch_remove(keys)
    writer.detach_storage_backend()
    reader.detach_storage_backend()
    return times, nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layouts", default="page_first,layer_first")
    args = ap.parse_args()
    page_mib = 2 * LAYERS * HEADS * HEAD_DIM * 2 * PAGE / (1 << 20)
    print("SGLang HiCache L3 through kvengine: %d layers x %d heads x %d, bf16, %d-token pages "
          "(%.0f MiB a page), %d pages a request, median of %d" % (
              LAYERS, HEADS, HEAD_DIM, PAGE, page_mib, args.pages, args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        ctx = multiprocessing.get_context("spawn")
        sock = os.path.join(tmp, "owner.sock")
        parent, child = ctx.Pipe()
        owner = ctx.Process(target=owner_process, args=(child, tmp + "/attached", sock))
        owner.start()
        assert parent.recv() == "ready"
        try:
            for layout in args.layouts.split(","):
                for mode, store in (("in-process", {"path": tmp + "/own"}),
                                    ("attached", {"attach": sock})):
                    times, nbytes = measure(store, layout, args.pages, args.repeat)
                    gib = nbytes / float(1 << 30)
                    discarded = times.pop("discarded")
                    rate = {k: gib / statistics.median(v) for k, v in times.items()}
                    ratio = {op: statistics.median(m / t for t, m in zip(
                        times[op], times["memcpy_" + op])) for op in ("set", "get")}
                    print("%-11s %-10s set %6.2f GiB/s (memcpy %6.2f) = %.2f   "
                          "get %6.2f GiB/s (memcpy %6.2f) = %.2f" % (
                              layout, mode, rate["set"], rate["memcpy_set"], ratio["set"],
                              rate["get"], rate["memcpy_get"], ratio["get"]) +
                          ("   (%d rounds discarded)" % discarded if discarded else ""))
        finally:
            parent.send("stop")
            owner.join(60)


if __name__ == "__main__":
    main()
