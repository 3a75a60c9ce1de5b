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

from kvengine.sglang._sglang_compat import PoolName, PoolTransfer  # noqa: E402

LAYERS, LORA, ROPE, INDEX_DIM, PAGE = 61, 512, 64, 128, 64
STORE = dict(memory_capacity_bytes="3GiB", apply_environment=False)


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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
    return statistics.median(b / m for b, m in zip(base, measured))


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
        group_parts = ([kv_meta[i][0] + ix_meta[i][0] for i in range(pages)],
                       [kv_meta[i][1] + ix_meta[i][1] for i in range(pages)])
        two_parts = ([p for i in range(pages) for p in (kv_meta[i][0], ix_meta[i][0])],
                     [s for i in range(pages) for s in (kv_meta[i][1], ix_meta[i][1])])
        t = {"gput": [], "kput": [], "gget": [], "kget": []}
        steps = {
            "gput": lambda: store.batch_put_from_multi_buffers(group_keys, *group_parts),
            "kput": lambda: store.batch_put_from_multi_buffers(two_keys, *two_parts),
            "gget": lambda: store.batch_get_into_multi_buffers(group_keys, *group_parts),
            "kget": lambda: store.batch_get_into_multi_buffers(two_keys, *two_parts)}
        for round_ in range(args.repeat):
            store.batch_remove(group_keys)
            store.batch_remove(two_keys)
            # Alternate which goes first, so neither always follows the other's writes.
            order = ["gput", "kput", "gget", "kget"] if round_ % 2 == 0 else \
                ["kput", "gput", "kget", "gget"]
            for name in order:
                t[name].append(seconds(steps[name]))
        assert all(r == kv_bytes + ix_bytes for r in store.batch_get_into_multi_buffers(
            group_keys, *group_parts))
        gib = pages * (kv_bytes + ix_bytes) / float(1 << 30)
        print("groups  put %6.2f GiB/s (two keys %6.2f) = %.2f   get %6.2f GiB/s "
              "(two keys %6.2f) = %.2f" % (
                  gib / statistics.median(t["gput"]), gib / statistics.median(t["kput"]),
                  median_ratio(t["kput"], t["gput"]), gib / statistics.median(t["gget"]),
                  gib / statistics.median(t["kget"]), median_ratio(t["kget"], t["gget"])))
        store.batch_remove(group_keys)
        store.batch_remove(two_keys)

        # ---- v2 (the controller's hybrid steps) against v1 of the same bytes
        # A latent as wide as KV and indexer together (132 indexer bytes a token and
        # layer are 66 more bf16 latent elements).
        pc, pkv = plain_backend(tmp + "/db", pages, LORA + ix_bytes // (LAYERS * PAGE) // 2)
        assert sum(pkv.get_page_buffer_meta(torch.arange(PAGE))[1]) == kv_bytes + ix_bytes
        plain = pc.storage_backend
        pslots = pkv.alloc(pages * PAGE)
        v = {"v2set": [], "v1set": [], "v2get": [], "v1get": []}
        indexer = [PoolTransfer(name=PoolName.INDEXER, host_indices=slots, keys=hashes,
                                indices_from_pool=PoolName.KV)]
        steps = {
            "v2set": lambda: ok.update(a=backend.batch_set_v2(indexer),
                                       b=backend.batch_set_v1(hashes, slots)),
            "v1set": lambda: ok.update(c=plain.batch_set_v1(hashes, pslots)),
            "v2get": lambda: ok.update(d=backend.batch_get_v1(hashes, slots),
                                       e=backend.batch_get_v2(indexer)),
            "v1get": lambda: ok.update(f=plain.batch_get_v1(hashes, pslots))}
        for round_ in range(args.repeat):
            store.batch_remove(backend._keys.pages(hashes))
            store.batch_remove(plain._keys.pages(hashes))
            ok = {}
            order = ["v2set", "v1set", "v2get", "v1get"] if round_ % 2 == 0 else \
                ["v1set", "v2set", "v1get", "v2get"]
            for name in order:
                v[name].append(seconds(steps[name]))
            assert all(ok["a"][PoolName.INDEXER]) and all(ok["b"]) and all(ok["c"])
            assert all(ok["d"]) and all(ok["e"][PoolName.INDEXER]) and all(ok["f"])
        print("v2      set %6.2f GiB/s (v1 %6.2f) = %.2f   get %6.2f GiB/s (v1 %6.2f) = %.2f"
              % (gib / statistics.median(v["v2set"]), gib / statistics.median(v["v1set"]),
                 median_ratio(v["v1set"], v["v2set"]), gib / statistics.median(v["v2get"]),
                 gib / statistics.median(v["v1get"]), median_ratio(v["v1get"], v["v2get"])))
        c.detach_storage_backend()
        pc.detach_storage_backend()


if __name__ == "__main__":
    main()
