"""Page groups and SGLang's v2 interface through kvengine, each against its baseline in
the same run (docs/benchmarks.md, "SGLang hybrid models").

    PYTHONPATH=build/python:test/python /usr/bin/python3 python/bench/bench_sglang_hybrid.py \
        [--pages 32] [--repeat 11]

The request: --pages pages of a DeepSeek-V3.2-like model (61 layers, MLA latent 512 + 64
rope in bf16, DSA indexer keys of 128 fp8 + scales, 64-token pages: a 4.3 MiB KV page and
a 0.5 MiB indexer page), in the store's memory tier (this process owns it).

* groups: the KV page and its indexer page put and read as one key of two parts (a
  page group, include/kvengine/db.h) against the same bytes put and read as two keys;
  ratio = two keys' time / the group's (1.0: a group costs nothing).
* v2: SGLang's hybrid controller steps for the request (batch_set_v2 of the indexer,
  which writes the groups, then batch_set_v1 of the KV; batch_get_v1, then
  batch_get_v2) against v1 of the same bytes: an MLA pool whose page is as large as KV
  and indexer together (latent 626 + rope 16) through batch_set_v1 / batch_get_v1;
  ratio = v1's time / v2's.

And a Qwen3-Next-like MHA + Mamba model (12 full-attention layers of 2 KV heads x 256
in bf16, 64-token pages: a 1.5 MiB KV page; 36 linear-attention layers of fp32 state:
a 9.8 MiB Mamba state per prefix):

* state groups: --pages // 4 prefixes' last KV page and its state put and read as one
  key (the trailing group) against the same bytes as two keys.
* v2 mamba: the controller's steps for a prefix of --pages pages (batch_set_v2 of the
  state, then batch_set_v1 of the KV pages, which puts the group; batch_get_v1, then
  batch_get_v2) against v1 of the same bytes: batch_set_v1 / batch_get_v1 of the KV
  pages and the state as a key of its own (the layout before the groups).

Each ratio is printed with the best round's ratio and the median ratio of the CPU time
the process spent (every thread): on a loaded machine the wall time moves with the other
processes' load, the CPU time with the work done.

Rounds interleave the measured path and its baseline, the two in turns first; each set
runs on an empty store
(the pages are removed before each round, outside the timing); figures are medians over
the rounds.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "test", "python"))
import sglang_fakes as fk  # noqa: E402

from kvengine.sglang._sglang_compat import (  # noqa: E402
    PoolHitPolicy, PoolName, PoolTransfer)

LAYERS, LORA, ROPE, INDEX_DIM, PAGE = 61, 512, 64, 128, 64
STORE = dict(memory_capacity_bytes="3GiB", apply_environment=False)


def seconds(fn):
    """(wall seconds, CPU seconds of this process, every thread) of fn: the CPU time
    counts the work done, which the machine's other load moves far less than the wall
    time."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def fill(tensor, seed):
    g = torch.Generator().manual_seed(seed)
    raw = tensor.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))


def dsa_backend(path, pages):
    dev = fk.DSATokenToKVPool((pages + 4) * PAGE, PAGE, LORA, torch.bfloat16, ROPE, LAYERS,
                              "cpu", INDEX_DIM, False, LORA + ROPE)
    kv = fk.MLATokenToKVPoolHost(dev, 1.0, 0, PAGE, "page_first", pin_memory=False)
    ix = fk.DSAIndexerPoolHost(dev, kv, "page_first", pin_memory=False)
    group = fk.HostPoolGroup([fk.PoolEntry(PoolName.KV, kv, dev, None, True),
                              fk.PoolEntry(PoolName.INDEXER, ix, dev, None)])
    fill(kv.kv_buffer, 1)
    fill(ix.index_k_with_scale_buffer, 2)
    allocator = fk.TokenToKVPoolAllocator(dev.size, dev.dtype, "cpu", dev, False)
    c = fk.HybridCacheController(allocator, group, PAGE, None, None,
                                 storage_backend="dynamic", model_name="bench/dsa",
                                 storage_backend_extra_config=fk.kvengine_extra_config(
                                     path=path, **STORE))
    return c, kv, ix


def plain_backend(path, pages, lora):
    dev = fk.MLATokenToKVPool((pages + 4) * PAGE, PAGE, torch.bfloat16, lora, ROPE, LAYERS,
                              "cpu", False)
    kv = fk.MLATokenToKVPoolHost(dev, 1.0, 0, PAGE, "page_first", pin_memory=False)
    fill(kv.kv_buffer, 3)
    return fk.make_controller(dev, kv, fk.kvengine_extra_config(path=path, **STORE),
                              model_name="bench/plain"), kv


def median_ratio(base, measured):
    return statistics.median(b / m for b, m in zip(base, measured) if m > 0)


def compare(steps, repeat, clear):
    """{name: [seconds]} of steps measured -> baseline -> ... in rounds, each pair in
    turns first: steps is [(measured, fn), (baseline, fn)] per operation, in order."""
    t = {name: [] for pair in steps for name, _ in pair}
    for round_ in range(repeat):
        clear()
        for pair in steps:
            for name, fn in (pair if round_ % 2 == 0 else pair[::-1]):
                t[name].append(seconds(fn))
    return t


def groups_against_two_keys(store, group_keys, two_keys, first, second, repeat):
    """Times each page's two members (first[i], second[i]: (pointers, sizes) of its host
    pages) put and read as one key of both parts (group_keys) against two keys each
    (two_keys, in member order), in turns; returns compare's times and the group parts.
    Both key sets are removed before each round and after."""
    n = len(group_keys)
    group_parts = ([first[i][0] + second[i][0] for i in range(n)],
                   [first[i][1] + second[i][1] for i in range(n)])
    two_parts = ([p for i in range(n) for p in (first[i][0], second[i][0])],
                 [s for i in range(n) for s in (first[i][1], second[i][1])])

    def clear():
        store.batch_remove(group_keys)
        store.batch_remove(two_keys)

    t = compare([
        [("gput", lambda: store.batch_put_from_multi_buffers(group_keys, *group_parts)),
         ("kput", lambda: store.batch_put_from_multi_buffers(two_keys, *two_parts))],
        [("gget", lambda: store.batch_get_into_multi_buffers(group_keys, *group_parts)),
         ("kget", lambda: store.batch_get_into_multi_buffers(two_keys, *two_parts))]],
        repeat, clear)
    return t, group_parts, clear


def report(label, gib, t, names):
    """One line: each operation's GiB/s, its baseline's and the ratio (baseline time /
    measured time: 1.0 is no cost), the best round's, and the ratio of CPU times."""
    line = "%-8s" % label
    for op, measured, base, base_label in names:
        wall_m, wall_b = [w for w, _ in t[measured]], [w for w, _ in t[base]]
        cpu_m, cpu_b = [c for _, c in t[measured]], [c for _, c in t[base]]
        line += "  %s %6.2f GiB/s (%s %6.2f) = %.2f [best %.2f, cpu %.2f]" % (
            op, gib / statistics.median(wall_m), base_label,
            gib / statistics.median(wall_b), median_ratio(wall_b, wall_m),
            min(wall_b) / min(wall_m), median_ratio(cpu_b, cpu_m))
    print(line)


def mamba_backend(path, pages, groups):
    """A Qwen3-Next-like MHA + Mamba instance: KV pool, Mamba state pool, controller."""
    kv_dev, kv = fk.make_pools("mha", "page_first", torch.bfloat16, layers=12, heads=2,
                               head_dim=256, page_size=PAGE, pages=pages + 4)
    state_dev = fk.MambaPoolDescriptor(groups + 2, 36, [(2048, 3)], (4, 128, 128),
                                       torch.float32)
    state = fk.MambaPoolHost(state_dev, 1.0, 0, pin_memory=False, layout="page_first")
    fill(kv.kv_buffer, 4)
    for t in state.get_hybrid_pool_buffer():
        fill(t, 5)
    group = fk.HostPoolGroup([fk.PoolEntry(PoolName.KV, kv, kv_dev, None, True),
                              fk.PoolEntry(PoolName.MAMBA, state, state_dev, None)])
    allocator = fk.TokenToKVPoolAllocator(kv_dev.size, kv_dev.dtype, "cpu", kv_dev, False)
    c = fk.HybridCacheController(allocator, group, PAGE, None, None,
                                 storage_backend="dynamic", model_name="bench/mamba",
                                 storage_backend_extra_config=fk.kvengine_extra_config(
                                     path=path, **STORE))
    return c, kv, state


def bench_mamba(tmp, pages, repeat):
    groups = max(1, pages // 4)
    c, kv, state = mamba_backend(tmp + "/mamba", pages, groups)
    backend = c.storage_backend
    store = backend._store
    hashes = fk.get_hash_str(list(range(pages * PAGE)), None, PAGE)
    slots = kv.alloc(pages * PAGE)
    states = state.alloc(groups)
    kv_meta = [kv.get_page_buffer_meta(slots[i * PAGE:(i + 1) * PAGE]) for i in range(pages)]
    st_meta = [state.get_page_buffer_meta(states[i:i + 1]) for i in range(groups)]
    kv_bytes, st_bytes = sum(kv_meta[0][1]), sum(st_meta[0][1])
    print("mamba:  pages of KV %.2f MiB, a state of %.2f MiB, median of %d rounds" % (
        kv_bytes / 2**20, st_bytes / 2**20, repeat))

    # ---- state groups: a prefix's last KV page and its state as one key, or two
    group_keys = ["g/%s" % h for h in hashes[:groups]]
    two_keys = [k for h in hashes[:groups] for k in ("k/%s" % h, "s/%s" % h)]
    t, _, clear = groups_against_two_keys(store, group_keys, two_keys, kv_meta, st_meta, repeat)
    clear()
    report("states", groups * (kv_bytes + st_bytes) / float(1 << 30), t,
           [("put", "gput", "kput", "two keys"), ("get", "gget", "kget", "two keys")])

    # ---- v2 (the controller's steps, the state in a group) against v1 + a state key
    mamba = [PoolTransfer(name=PoolName.MAMBA, host_indices=states[:1], keys=hashes[-1:],
                          hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    state_key = ["s/%s" % hashes[-1]]
    side = backend._side_pools[PoolName.MAMBA.value]
    ok = {}

    def v2_set():
        ok.update(a=backend.batch_set_v2(mamba), b=backend.batch_set_v1(hashes, slots))

    def v1_set():
        ok.update(c=backend.batch_set_v1(hashes, slots),
                  s=store.batch_put_from_multi_buffers(state_key, [st_meta[0][0]],
                                                       [st_meta[0][1]]))

    def v2_get():
        ok.update(d=backend.batch_get_v1(hashes, slots), e=backend.batch_get_v2(mamba))

    def v1_get():
        ok.update(f=backend.batch_get_v1(hashes, slots),
                  g=store.batch_get_into_multi_buffers(state_key, [st_meta[0][0]],
                                                       [st_meta[0][1]]))

    def clear_pages():
        store.batch_remove(backend._keys.pages(hashes))
        store.batch_remove(backend._group_keys(side, hashes[-1:]) + state_key)

    def check():
        assert all(ok["a"][PoolName.MAMBA]) and all(ok["b"]) and all(ok["c"])
        assert all(ok["d"]) and all(ok["e"][PoolName.MAMBA]) and all(ok["f"])
        assert ok["s"] == [0] and ok["g"] == [st_bytes]

    # v1 and v2 share the KV pages' keys: each pair runs on an empty store.
    v = {n: [] for n in ("v2set", "v1set", "v2get", "v1get")}
    for round_ in range(repeat):
        order = [("v2set", v2_set, "v2get", v2_get), ("v1set", v1_set, "v1get", v1_get)]
        for set_name, set_fn, get_name, get_fn in (order if round_ % 2 == 0 else order[::-1]):
            clear_pages()
            v[set_name].append(seconds(set_fn))
            v[get_name].append(seconds(get_fn))
        check()
    clear_pages()
    report("v2 mamba", (pages * kv_bytes + st_bytes) / float(1 << 30), v,
           [("set", "v2set", "v1set", "v1"), ("get", "v2get", "v1get", "v1")])
    c.detach_storage_backend()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=11)
    args = ap.parse_args()
    pages = args.pages
    with tempfile.TemporaryDirectory() as tmp:
        fk.set_parallel(0, 1)
        c, kv, ix = dsa_backend(tmp + "/db", pages)
        backend = c.storage_backend
        store = backend._store
        hashes = fk.get_hash_str(list(range(pages * PAGE)), None, PAGE)
        slots = kv.alloc(pages * PAGE)
        kv_meta = [kv.get_page_buffer_meta(slots[i * PAGE:(i + 1) * PAGE]) for i in range(pages)]
        ix_meta = [ix.get_page_buffer_meta(slots[i * PAGE:(i + 1) * PAGE]) for i in range(pages)]
        kv_bytes, ix_bytes = sum(kv_meta[0][1]), sum(ix_meta[0][1])
        print("hybrid pages: %d x (KV %.2f MiB + indexer %.2f MiB), median of %d rounds" % (
            pages, kv_bytes / 2**20, ix_bytes / 2**20, args.repeat))

        # ---- groups: one key of two parts against two keys
        group_keys = ["g/%s" % h for h in hashes]
        two_keys = [k for h in hashes for k in ("k/%s" % h, "i/%s" % h)]
        t, group_parts, clear = groups_against_two_keys(store, group_keys, two_keys, kv_meta,
                                                        ix_meta, args.repeat)
        assert all(r == kv_bytes + ix_bytes for r in store.batch_get_into_multi_buffers(
            group_keys, *group_parts))
        gib = pages * (kv_bytes + ix_bytes) / float(1 << 30)
        report("groups", gib, t, [("put", "gput", "kput", "two keys"),
                                  ("get", "gget", "kget", "two keys")])
        clear()

        # ---- v2 (the controller's hybrid steps) against v1 of the same bytes
        # A latent as wide as KV and indexer together (132 indexer bytes a token and
        # layer are 66 more bf16 latent elements).
        pc, pkv = plain_backend(tmp + "/db", pages, LORA + ix_bytes // (LAYERS * PAGE) // 2)
        assert sum(pkv.get_page_buffer_meta(torch.arange(PAGE))[1]) == kv_bytes + ix_bytes
        plain = pc.storage_backend
        pslots = pkv.alloc(pages * PAGE)
        indexer = [PoolTransfer(name=PoolName.INDEXER, host_indices=slots, keys=hashes,
                                indices_from_pool=PoolName.KV)]
        ok = {}

        def clear_pages():
            store.batch_remove(backend._keys.pages(hashes))
            store.batch_remove(plain._keys.pages(hashes))

        v = compare([
            [("v2set", lambda: ok.update(a=backend.batch_set_v2(indexer),
                                         b=backend.batch_set_v1(hashes, slots))),
             ("v1set", lambda: ok.update(c=plain.batch_set_v1(hashes, pslots)))],
            [("v2get", lambda: ok.update(d=backend.batch_get_v1(hashes, slots),
                                         e=backend.batch_get_v2(indexer))),
             ("v1get", lambda: ok.update(f=plain.batch_get_v1(hashes, pslots)))]],
            args.repeat, clear_pages)
        assert all(ok["a"][PoolName.INDEXER]) and all(ok["b"]) and all(ok["c"])
        assert all(ok["d"]) and all(ok["e"][PoolName.INDEXER]) and all(ok["f"])
        report("v2 dsa", gib, v, [("set", "v2set", "v1set", "v1"),
                                  ("get", "v2get", "v1get", "v1")])
        c.detach_storage_backend()
        pc.detach_storage_backend()
        bench_mamba(tmp, pages, args.repeat)


if __name__ == "__main__":
    main()
