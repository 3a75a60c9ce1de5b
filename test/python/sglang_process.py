"""One tensor-parallel rank of an SGLang instance, for test_sglang_processes.py: a spawned
process with SGLang's cache controller (the stand-in, sglang_fakes.py) and kvengine
attached to it as SGLang's "dynamic" storage backend, driven over a pipe.

Each configuration (kind, layout, dtype) gets its own host pool and controller in the
process, all sharing the process's one handle on the store, as SGLang's would.  A
rank's pages are filled with bytes drawn from (seed, rank), so pages of different ranks
differ and a read of another rank's page would show."""
import hashlib
import os
import traceback

import torch

import sglang_fakes as fk

PAGE = 16
OPTIONS = dict(memory_capacity_bytes="64MiB", prefault_memory=False,
               ssd_capacity_bytes="256MiB", apply_environment=False)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16,
          "float8_e4m3fn": fk.FP8_E4M3}


def digest(data):
    return hashlib.sha256(data).hexdigest()


class Rank:
    def __init__(self, store, rank, tp_size):
        fk.set_parallel(rank, tp_size)
        self.store, self.rank = store, rank
        self.controllers = {}  # (kind, layout, dtype) -> (controller, host pool)

    def controller(self, config):
        if config not in self.controllers:
            kind, layout, dtype = config
            dev, host = fk.make_pools(kind, layout, DTYPES[dtype], page_size=PAGE, pages=24)
            extra = fk.kvengine_extra_config(**self.store, **OPTIONS)
            self.controllers[config] = (fk.make_controller(dev, host, extra), host)
        return self.controllers[config]

    def backup(self, config, tokens, pages, seed, skip_pages=0):
        """Fills host slots with this rank's bytes and backs up the listed pages of the
        prompt (a hole where a page is not listed): (tokens backed up, page digests)."""
        c, host = self.controller(config)
        fk.fill_random(host, seed * 100 + self.rank)
        hashes = fk.get_hash_str(tokens, None, PAGE)
        host.alloc(skip_pages * PAGE)
        slots = host.alloc(len(pages) * PAGE)
        op = fk.StorageOperation(slots, tokens, hash_value=[hashes[p] for p in pages])
        if not c.backup_skip:
            c._page_backup(op)
        out = [digest(fk.page_bytes(host, int(slots[i * PAGE]))) for i in range(len(pages))]
        host.free(slots)
        return op.completed_tokens, out

    def hit(self, config, tokens):
        """The prefetch thread's storage hit query for the prompt: tokens found."""
        c, _ = self.controller(config)
        op = fk.PrefetchOperation("q", tokens)
        return c._storage_hit_query(op)[1]

    def load(self, config, tokens, hit_tokens, skip_pages=0):
        """Prefetches the first hit_tokens tokens into host slots after skip_pages pages
        (other indices than the writer's): (tokens loaded, page digests)."""
        c, host = self.controller(config)
        host.kv_buffer.view(-1).view(torch.uint8).fill_(0)
        hashes = fk.get_hash_str(tokens, None, PAGE)[:hit_tokens // PAGE]
        host.alloc(skip_pages * PAGE)
        slots = host.alloc(len(hashes) * PAGE)
        op = fk.PrefetchOperation("r", tokens)
        op.hash_value, op.host_indices = hashes, slots
        c._page_transfer(op)
        out = [digest(fk.page_bytes(host, int(slots[i * PAGE]))) for i in range(len(hashes))]
        host.free(slots)
        return op.completed_tokens, out

    def keys(self, config, tokens, pages):
        """The store keys of the listed pages of the prompt, as this rank writes them."""
        c, _ = self.controller(config)
        hashes = fk.get_hash_str(tokens, None, PAGE)
        return c.storage_backend._keys.pages([hashes[p] for p in pages])

    def stats(self, config):
        c, _ = self.controller(config)
        return vars(c.storage_backend.get_stats())

    def attached(self, config):
        c, _ = self.controller(config)
        return c.storage_backend._store.attached

    def close(self):
        for c, _ in self.controllers.values():
            c.detach_storage_backend()


def main(conn, store, rank, tp_size):
    try:
        state = Rank(store, rank, tp_size)
        conn.send(("ready", os.getpid()))
        while True:
            command, args = conn.recv()
            try:
                value = getattr(state, command)(*args)
            except Exception:  # noqa: BLE001 -- reported to the test
                conn.send(("error", traceback.format_exc()))
                continue
            conn.send(("ok", value))
            if command == "close":
                return
    except Exception:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
