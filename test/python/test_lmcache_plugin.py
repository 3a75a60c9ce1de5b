"""kvengine as LMCache's L2 store (docs/lmcache.md): the plug-in built from the
--l2-adapter JSON by the stand-ins of LMCache's config parser and native_plugin factory
(lmcache_fakes.py, faithful to LMCache main), driven by its NativeConnectorL2Adapter
from separate store, lookup and delete threads, and by two LMCache processes sharing
one store.  Real engine, real eventfds, real processes."""
import argparse
import json
import multiprocessing
import os
import select
import threading
import time

import pytest

import kvengine
import lmcache_driver as drv
import lmcache_fakes as lf
import lmcache_process
from kvengine.lmcache import KVEngineL2Plugin

SMALL = dict(memory_capacity_bytes="64MiB", prefault_memory=False, apply_environment=False)
CHUNK = 64 << 10


@pytest.fixture
def adapter(db_path):
    a = lf.make_adapter_from_cli(drv.spec(path=db_path, **SMALL))
    yield a
    a.close()


def chunks(adapter, numbers, size=CHUNK):
    return drv.store(adapter, [drv.key(i) for i in numbers],
                     [drv.memory_obj(drv.chunk_bytes(i, size)) for i in numbers])


# ------------------------------------------------------------------ loading the plug-in

def test_cli_spec_builds_the_plugin_through_lmcache_factory(adapter):
    assert isinstance(adapter, lf.NativeConnectorL2Adapter)
    assert isinstance(adapter._client, KVEngineL2Plugin)
    assert adapter._has_delete  # else LMCache's L2 eviction would only log a warning
    assert adapter.report_status() == {"is_healthy": True, "type": "native_plugin"}
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(),
           adapter.get_load_event_fd(), adapter._client.event_fd()}
    assert len(fds) == 4


@pytest.mark.parametrize("params, error, match", [
    ({}, ValueError, "exactly one of path"),
    ({"path": "/x", "attach": "/y"}, ValueError, "exactly one of path"),
    ({"path": "P", "no_such_option": 1}, ValueError, "no_such_option"),
    ({"path": "P", "memory_capacity_bytes": "lots"}, ValueError, "memory_capacity_bytes"),
    ({"path": "P", "num_workers": 0}, ValueError, "workers"),
    ({"path": "P", "num_workers": "4"}, TypeError, "num_workers"),
    ({"path": "P", "register_buffers": 1}, TypeError, "register_buffers"),
])
def test_bad_adapter_params_are_refused_by_name(db_path, params, error, match):
    params = {k: (db_path if v == "P" else v) for k, v in params.items()}
    with pytest.raises(error, match=match):
        lf.make_adapter_from_cli(drv.spec(**{**SMALL, **params}))
    # Nothing is left holding the store: it opens afterwards.
    KVEngineL2Plugin(path=db_path, **SMALL).close()


def test_lmcache_rejects_a_bad_spec_before_loading_anything():
    with pytest.raises(ValueError, match="module_path"):
        lf.make_adapter_from_cli('{"type": "native_plugin", "class_name": "X"}')


def _spec_config(spec):
    args = lf.add_l2_adapters_args(argparse.ArgumentParser()).parse_args(
        ["--l2-adapter", json.dumps(spec)])
    return lf.parse_args_to_l2_adapters_config(args).adapters[0]


def test_lmcache_eviction_is_on_only_with_an_eviction_object_in_the_spec(db_path):
    """LMCache evicts from the plug-in (submit_batch_delete) only when the adapter spec
    has "eviction" as well as max_capacity_gb > 0; it refuses an unknown policy."""
    spec = json.loads(drv.spec(path=db_path, **SMALL))
    plain = _spec_config({**spec, "max_capacity_gb": 1})
    assert plain.eviction_config is None and plain.max_capacity_gb == 1.0
    assert plain.persist_config.persist_enabled and plain.serde_config is None
    evicting = _spec_config({**spec, "max_capacity_gb": 1,
                             "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.9}})
    assert evicting.eviction_config == lf.EvictionConfig("LRU", 0.9, 0.2)
    with pytest.raises(ValueError, match="eviction_policy must be"):
        _spec_config({**spec, "eviction": {"eviction_policy": "FIFO"}})
    with pytest.raises(ValueError, match="'serde' dict must include a 'type'"):
        _spec_config({**spec, "serde": {}})


# ------------------------------------------------------------------ the operations

def test_store_lookup_with_a_hole_and_load_bit_exact(adapter):
    assert chunks(adapter, [0, 1, 3]).is_successful()
    keys = [drv.key(i) for i in range(4)]
    assert drv.lookup(adapter, keys) == [True, True, False, True]
    assert adapter._locked_keys[keys[0]] == 1 and keys[2] not in adapter._locked_keys
    objs = [drv.memory_obj(size=CHUNK, fill=0x5A) for _ in range(4)]
    assert drv.load(adapter, keys, objs) == [True, True, False, True]
    for i in (0, 1, 3):
        assert bytes(objs[i].byte_array) == drv.chunk_bytes(i, CHUNK)
    assert bytes(objs[2].byte_array) == b"\x5a" * CHUNK  # the hole is left alone
    adapter.submit_unlock(keys)
    assert not adapter._locked_keys


def test_load_over_stale_bytes(adapter):
    """A load writes every byte of the destination; a value of another size (a stale chunk
    of another layout) is not counted as loaded."""
    assert chunks(adapter, [7]).is_successful()
    obj = drv.memory_obj(data=bytes(range(256)) * (CHUNK // 256))
    assert drv.load(adapter, [drv.key(7)], [obj]) == [True]
    assert bytes(obj.byte_array) == drv.chunk_bytes(7, CHUNK)
    bigger = drv.memory_obj(size=CHUNK * 2, fill=1)
    assert drv.load(adapter, [drv.key(7)], [bigger]) == [False]
    smaller = drv.memory_obj(size=CHUNK // 2, fill=1)
    assert drv.load(adapter, [drv.key(7)], [smaller]) == [False]


def test_restore_overwrites_and_salted_keys_are_apart(adapter):
    assert chunks(adapter, [1]).is_successful()
    newer = drv.chunk_bytes(100, CHUNK)
    assert drv.store(adapter, [drv.key(1)], [drv.memory_obj(newer)]).is_successful()
    salted = drv.key(1, salt="user-b")
    assert drv.lookup(adapter, [drv.key(1), salted]) == [True, False]
    obj = drv.memory_obj(size=CHUNK)
    assert drv.load(adapter, [drv.key(1)], [obj]) == [True]
    assert bytes(obj.byte_array) == newer


def test_delete_reports_per_key_so_usage_goes_down(db_path):
    a = lf.make_adapter_from_cli(drv.spec(path=db_path, **SMALL).replace(
        '"adapter_params"', '"max_capacity_gb": 1, "adapter_params"'))
    try:
        assert chunks(a, [0, 1, 2]).bytes_transferred() == 3 * CHUNK
        assert a.get_usage().total_bytes_used == 3 * CHUNK
        a.delete([drv.key(0), drv.key(2), drv.key(9)])  # 9 was never stored
        assert a.get_usage().total_bytes_used == CHUNK
        assert drv.lookup(a, [drv.key(i) for i in range(3)]) == [False, True, False]
    finally:
        a.close()


def test_completions_shape(db_path):
    """(future_id, ok, error, per-key bools or None): None only for a set; a missing key
    is False, never None (LMCache would count it as loaded)."""
    p = KVEngineL2Plugin(path=db_path, **SMALL)
    try:
        src = bytearray(b"v" * 100)
        ids = [p.submit_batch_set(["a"], [memoryview(src)])]
        done = _drain_until(p, len(ids))
        ids = [p.submit_batch_get(["a", "missing"], [memoryview(bytearray(100)),
                                                     memoryview(bytearray(100))]),
               p.submit_batch_exists(["missing", "a"])]
        done += _drain_until(p, 2)
        ids.append(p.submit_batch_delete(["a", "missing"]))
        done += _drain_until(p, 1)
        by_id = {c[0]: c for c in done}
        assert by_id[1] == (1, True, "", None)
        fid, ok, error, bools = by_id[ids[0]]
        assert (ok, bools) == (False, [True, False])
        assert "1 of 2 keys failed" in error and "'missing'" in error
        assert by_id[ids[1]][1:] == (True, "", [False, True])
        assert by_id[ids[2]][1:] == (True, "", [True, False])
    finally:
        p.close()


def _drain_until(p, n):
    out = []
    deadline = time.monotonic() + drv.WAIT_S
    while len(out) < n:
        assert time.monotonic() < deadline
        select.select([p.event_fd()], [], [], 0.5)
        out += p.drain_completions()
    return out


def test_drain_resets_the_eventfd(db_path):
    p = KVEngineL2Plugin(path=db_path, **SMALL)
    try:
        p.submit_batch_exists(["a"])
        assert len(_drain_until(p, 1)) == 1
        assert select.select([p.event_fd()], [], [], 0)[0] == []
        assert p.drain_completions() == []
    finally:
        p.close()


def test_a_failed_set_is_reported_whole_with_a_clear_error(db_path):
    p = KVEngineL2Plugin(path=db_path, **SMALL)
    try:
        v = memoryview(bytearray(10))
        p.submit_batch_set(["dup", "dup"], [v, v])          # refused as a whole
        p.submit_batch_set(["", "ok"], [v, v])              # one key refused
        done = sorted(_drain_until(p, 2))
        assert done[0][1] is False and "InvalidArgument" in done[0][2] and done[0][3] is None
        assert done[1][1] is False and "1 of 2 keys failed" in done[1][2]
    finally:
        p.close()


@pytest.mark.parametrize("call, args, error, match", [
    ("submit_batch_set", (["a"], [b"x", b"y"]), ValueError, "2 memoryviews for 1 keys"),
    ("submit_batch_get", (["a"], [b"xx"]), ValueError, "writable"),
    ("submit_batch_set", ([1], [b"x"]), TypeError, r"keys\[0\] must be str"),
    ("submit_batch_set", ("a", [b"x"]), TypeError, "keys must be a list"),
    ("submit_batch_set", (["a"], [3]), TypeError, r"memoryviews\[0\] must be a memoryview"),
    ("submit_batch_exists", (None,), TypeError, "keys must be a list"),
])
def test_bad_arguments_raise_naming_them_and_queue_nothing(db_path, call, args, error, match):
    p = KVEngineL2Plugin(path=db_path, **SMALL)
    try:
        with pytest.raises(error, match=match):
            getattr(p, call)(*args)
        assert p.submit_batch_exists(["a"]) == 1  # the first future: nothing was queued
    finally:
        p.close()


# ------------------------------------------------------------------ threads

def test_store_lookup_and_delete_from_their_own_threads(adapter):
    """LMCache's store controller, prefetch controller and eviction each call from their
    own thread, all through the adapter's one lock; every chunk a lookup finds loads
    bit-exact, and the deletes leave exactly the chunks they did not name."""
    n, errors = 48, []
    stored = threading.Event()

    def storer():
        for start in range(0, n, 8):
            assert chunks(adapter, range(start, start + 8)).is_successful()
        stored.set()

    def prefetcher():
        while True:
            done = stored.is_set()
            keys = [drv.key(i) for i in range(n)]
            found = drv.lookup(adapter, keys)
            objs = [drv.memory_obj(size=CHUNK, fill=0xEE) for _ in range(n)]
            loaded = drv.load(adapter, keys, objs)
            for i in range(n):
                if loaded[i] and bytes(objs[i].byte_array) != drv.chunk_bytes(i, CHUNK):
                    errors.append("chunk %d loaded wrong bytes" % i)
            adapter.submit_unlock([k for k, f in zip(keys, found) if f])
            if done:
                return

    def evictor():
        stored.wait(drv.WAIT_S)
        adapter.delete([drv.key(i) for i in range(0, n, 2)])

    threads = [threading.Thread(target=run_catching(f, errors)) for f in
               (storer, prefetcher, evictor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(drv.WAIT_S * 2)
    assert errors == []
    assert drv.lookup(adapter, [drv.key(i) for i in range(n)]) == [i % 2 == 1 for i in range(n)]


def run_catching(fn, errors):
    def run():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- reported by the test
            errors.append("%s: %r" % (fn.__name__, e))
    return run


def test_submits_only_queue(db_path):
    """With one worker, a stream of 4 MiB sets all return before most have run:
    a submit under LMCache's shared lock never waits for the engine."""
    p = KVEngineL2Plugin(path=db_path, num_workers=1, memory_capacity_bytes="128MiB",
                         prefault_memory=False, apply_environment=False)
    try:
        value = memoryview(bytearray(os.urandom(4 << 20)))
        bufs = [value] * 12
        for i, b in enumerate(bufs):
            p.submit_batch_set(["big%d" % i], [b])
        assert len(p.drain_completions()) < len(bufs)
        done = _drain_until(p, len(bufs))
        assert all(c[1] for c in done)
    finally:
        p.close()


def test_close_with_batches_queued_and_after(db_path):
    p = KVEngineL2Plugin(path=db_path, num_workers=1, **SMALL)
    bufs = [memoryview(bytearray(1 << 20)) for _ in range(16)]
    for i, b in enumerate(bufs):
        p.submit_batch_set(["k%d" % i], [b])
    p.close()  # waits for the running set, completes the queued ones as failed
    p.close()
    assert p.event_fd() == -1
    with pytest.raises(RuntimeError, match="closed"):
        p.submit_batch_exists(["k0"])
    assert p.drain_completions() == []
    del bufs  # the pins were released: the buffers can go
    # The store was given back: it opens again.
    KVEngineL2Plugin(path=db_path, **SMALL).close()


def test_two_plugins_in_one_process_share_the_handle(db_path):
    a = KVEngineL2Plugin(path=db_path, **SMALL)
    b = KVEngineL2Plugin(path=db_path, **SMALL)
    try:
        a.submit_batch_set(["shared"], [memoryview(b"1234")])
        _drain_until(a, 1)
        b.submit_batch_exists(["shared"])
        assert _drain_until(b, 1)[0][3] == [True]
        a.close()
        b.submit_batch_exists(["shared"])
        assert _drain_until(b, 1)[0][3] == [True]
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ processes

class LMCacheProcess:
    def __init__(self, ctx, spec, size):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=lmcache_process.main, args=(child, spec, size),
                                   daemon=True)
        self.process.start()
        self.attached = self._answer()

    def _answer(self):
        deadline = time.monotonic() + drv.WAIT_S
        while not self.conn.poll(0.1):
            assert self.process.is_alive(), "the LMCache process died"
            assert time.monotonic() < deadline, "the LMCache process did not answer"
        status, value = self.conn.recv()
        assert status in ("ok", "ready"), value
        return value

    def __call__(self, command, *args):
        self.conn.send((command, list(args)))
        return self._answer()

    def close(self):
        if self.process.is_alive():
            self("close")
            self.process.join(drv.WAIT_S)


def test_two_lmcache_processes_share_one_store(db_path):
    ctx = multiprocessing.get_context("spawn")
    spec = drv.spec(path=db_path, ssd_capacity_bytes="256MiB", **SMALL)
    first = LMCacheProcess(ctx, spec, CHUNK)
    second = LMCacheProcess(ctx, spec, CHUNK)
    try:
        assert first.attached is None and second.attached  # one owner, one attached
        assert first("store", 0, 1, 2)
        assert second("lookup", 0, 1, 2, 3) == [True, True, True, False]
        assert second("load", 0, 2, 3) == ([True, True, False], [True, True, False])
        assert second("store", 10, 11)
        assert first("load", 10, 11) == ([True, True], [True, True])
        first.close()  # the owner goes: the other takes the store over
        deadline = time.monotonic() + drv.WAIT_S
        while not second("store", 20):  # the batch that finds the owner gone fails
            assert time.monotonic() < deadline
        assert second("attached") is None  # it owns the store now
        assert second("load", 20) == ([True], [True])
    finally:
        first.close()
        second.close()


def test_attach_to_a_served_store(db_path):
    owner = kvengine.DB(db_path, local_listen=db_path + ".sock", **SMALL)
    try:
        a = lf.make_adapter_from_cli(drv.spec(attach=db_path + ".sock"))
        try:
            assert a._client._shared.attached == db_path + ".sock"
            assert chunks(a, [5]).is_successful()
            assert owner.get_size(_key_string(5)) == CHUNK
        finally:
            a.close()
    finally:
        owner.close()


def _key_string(i):
    return lf._object_key_to_string(drv.key(i))
