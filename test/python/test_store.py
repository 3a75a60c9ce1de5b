"""The store API of the kvengine module against a real DB."""
import ctypes
import json
import gc
import os
import threading

import numpy as np

import pytest

import kvengine
from conftest import SMALL


def addr(buf):
    """The address of a bytearray / numpy array, as callers of the raw-pointer API do."""
    if isinstance(buf, np.ndarray):
        return buf.ctypes.data
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


# ------------------------------------------------------------------ opening


def test_open_context_manager_and_reopen(db_path):
    with kvengine.open(db_path, **SMALL) as db:
        assert db.is_open
        assert db.put("k", b"v") == 0
    assert not db.is_open
    assert db.put("k", b"v") == kvengine.ABORTED
    assert db.get("k") == b""
    assert db.close() == 0  # idempotent


def test_setup_returns_codes(db_path):
    db = kvengine.DB()
    assert not db.is_open
    assert db.put("k", b"v") == kvengine.ABORTED
    assert db.setup(db_path, **SMALL) == 0
    other = kvengine.DB()
    assert other.setup(db_path, **SMALL) == kvengine.BUSY  # the directory's LOCK
    with pytest.raises(kvengine.Error) as e:
        kvengine.DB(db_path, **SMALL)
    assert e.value.code == kvengine.BUSY and e.value.code_name == "busy"
    with pytest.raises(ValueError):
        db.setup(db_path, **SMALL)  # already open
    assert db.close() == 0


def test_setup_on_a_file_returns_a_code(tmp_path):
    # A path that is a file is an engine failure like any other: setup() returns its code
    # (it raised ValueError), DB() raises kvengine.Error.
    path = tmp_path / "a_file"
    path.write_bytes(b"not a DB")
    db = kvengine.DB()
    assert db.setup(str(path), **SMALL) == kvengine.INVALID_ARGUMENT
    assert not db.is_open
    with pytest.raises(kvengine.Error) as e:
        kvengine.DB(str(path), **SMALL)
    assert e.value.code == kvengine.INVALID_ARGUMENT and "not a directory" in str(e.value)
    assert path.read_bytes() == b"not a DB"


def test_setup_on_a_damaged_ssd_tier_returns_a_code(db_path):
    # A tombstone log that is not one failed recovery, and the failed tier's cleanup
    # crashed the interpreter.
    opts = dict(SMALL, ssd_capacity_bytes="64MiB")
    with kvengine.open(db_path, **opts) as db:
        assert db.put("k", b"v") == 0
    with open(os.path.join(db_path, "TOMBSTONES"), "wb") as f:
        f.write(b"garbage" * 10)
    db = kvengine.DB()
    assert db.setup(db_path, **opts) == kvengine.CORRUPTION
    assert not db.is_open


@pytest.mark.parametrize("opts, needle", [
    (dict(no_such_option=1), "no_such_option"),
    (dict(memory_capacity_bytes="lots"), "memory_capacity_bytes"),
    (dict(memory_eviction="sometimes"), "memory_eviction"),
    (dict(prefault_memory="perhaps"), "prefault_memory"),
])
def test_bad_options_raise_value_error_naming_them(db_path, opts, needle):
    with pytest.raises(ValueError, match=needle):
        kvengine.DB(db_path, **opts)
    with pytest.raises(ValueError, match=needle):
        kvengine.DB().setup(db_path, **opts)


def test_option_types(db_path):
    with pytest.raises(TypeError, match="max_key_size"):
        kvengine.DB(db_path, max_key_size=[1])
    opts = dict(SMALL, max_key_size=64, memory_eviction="none", use_huge_pages=False)
    with kvengine.open(db_path, **opts) as db:
        o = db.options()
        assert o["max_key_size"] == "64"
        assert o["memory_eviction"] == "none"
        assert db.put("x" * 65, b"v") == kvengine.INVALID_ARGUMENT
    assert "memory_capacity_bytes" in kvengine.OPTION_NAMES


def test_error_codes_documented():
    assert kvengine.ERROR_CODES[-1] == "not_found"
    assert kvengine.ERROR_CODES[-9] == "buffer_too_small"
    assert kvengine.error_name(-5) == "no_space"
    with pytest.raises(kvengine.Error) as e:
        kvengine.check(-3, "get")
    assert e.value.code == -3 and isinstance(e.value, RuntimeError)


# ------------------------------------------------------------------ single keys


def test_put_get_forms(db):
    value = bytes(range(256)) * 16
    assert db.put("a", value) == 0
    assert db.put(b"b", bytearray(value)) == 0
    assert db.put("c", memoryview(value)[100:200]) == 0
    assert db.put("d", np.arange(100, dtype=np.float32)) == 0
    assert db.put("e", b"") == 0
    assert db.get("a") == value
    assert db.get(b"b") == value
    assert db.get("c") == value[100:200]
    assert db.get("d") == np.arange(100, dtype=np.float32).tobytes()
    assert db.get("e") == b""
    assert db.get("missing") == b""
    assert db.get_size("a") == len(value)
    assert db.get_size("missing") == kvengine.NOT_FOUND
    assert db.is_exist("a") == 1 and db.is_exist("missing") == 0
    # UTF-8 keys and bytes keys are the same keys.
    assert db.put("ключ", b"1") == 0
    assert db.get("ключ".encode()) == b"1"


def test_pythonic_mapping(db):
    db["k"] = b"value"
    assert db["k"] == b"value" and db.read("k") == b"value"
    assert "k" in db and "nope" not in db
    del db["k"]
    with pytest.raises(KeyError):
        db["k"]
    with pytest.raises(KeyError):
        del db["k"]
    assert db.stats()["puts"] >= 1
    assert isinstance(db.perf(), dict)


def test_put_from_get_into_raw_pointers(db):
    src = bytearray(b"0123456789" * 100)
    assert db.put_from("raw", addr(src), len(src)) == 0
    dst = bytearray(len(src))
    assert db.get_into("raw", addr(dst), len(dst)) == len(src)
    assert dst == src
    small = bytearray(10)
    assert db.get_into("raw", addr(small), len(small)) == kvengine.BUFFER_TOO_SMALL
    assert db.get_into("missing", addr(dst), len(dst)) == kvengine.NOT_FOUND
    # Buffer forms of the same calls.
    arr = np.zeros(1000, dtype=np.uint8)
    assert db.get_into("raw", arr) == 1000
    assert arr.tobytes() == bytes(src)
    assert db.put_from("raw2", arr) == 0 and db.get("raw2") == bytes(src)


def test_remove_calls(db):
    for i in range(10):
        db.put("req1/layer.%d" % i, b"x")
        db.put("req2/layer.%d" % i, b"y")
    assert db.remove("req1/layer.0") == 0
    assert db.remove("req1/layer.0") == kvengine.NOT_FOUND
    assert db.batch_remove(["req1/layer.1", "nope", "req1/layer.2"]) == [0, -1, 0]
    assert db.remove_by_regex(r"req1/.*") == 7
    assert db.remove_by_regex(r"(unclosed") == kvengine.INVALID_ARGUMENT
    assert db.remove_all() == 10
    assert db.batch_is_exist(["req2/layer.0"]) == [0]
    assert db.flush() == 0


# ------------------------------------------------------------------ batches


def test_batch_put_get_buffers(db):
    keys = ["k%d" % i for i in range(64)]
    values = [np.random.default_rng(i).integers(0, 255, 4096 + i, dtype=np.uint8) for i in range(64)]
    assert db.batch_put_from(keys, values) == [0] * 64
    outs = [np.zeros(4096 + i, dtype=np.uint8) for i in range(64)]
    assert db.batch_get_into(keys, outs) == [4096 + i for i in range(64)]
    for v, o in zip(values, outs):
        assert np.array_equal(v, o)
    assert db.batch_is_exist(keys + ["nope"]) == [1] * 64 + [0]
    assert db.batch_put(["p"], [b"abc"]) == [0]


def test_batch_raw_pointers(db):
    srcs = [bytearray(bytes([i]) * (1000 + i)) for i in range(8)]
    keys = ["r%d" % i for i in range(8)]
    assert db.batch_put_from(keys, [addr(s) for s in srcs], [len(s) for s in srcs]) == [0] * 8
    dsts = [bytearray(2000) for _ in range(8)]
    got = db.batch_get_into(keys + ["nope"], [addr(d) for d in dsts] + [addr(dsts[0])],
                            [len(d) for d in dsts] + [10])
    assert got == [1000 + i for i in range(8)] + [kvengine.NOT_FOUND]
    for s, d in zip(srcs, dsts):
        assert d[:len(s)] == s


def test_multi_buffers(db):
    k = [bytearray(b"K" * 100), bytearray(b"k" * 50)]
    v = [bytearray(b"V" * 100), bytearray(b"v" * 50)]
    keys = ["block0", "block1"]
    ptrs = [[addr(k[0]), addr(v[0])], [addr(k[1]), addr(v[1])]]
    sizes = [[100, 100], [50, 50]]
    assert db.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0]
    assert db.get("block0") == b"K" * 100 + b"V" * 100
    outk = [bytearray(100), bytearray(50)]
    outv = [bytearray(100), bytearray(50)]
    got = db.batch_get_into_multi_buffers(
        keys, [[addr(outk[0]), addr(outv[0])], [addr(outk[1]), addr(outv[1])]], sizes)
    assert got == [200, 100]
    assert outk == k and outv == v
    # Buffer form, and a destination too small for the value fails only that key.
    a, b = np.zeros(100, np.uint8), np.zeros(100, np.uint8)
    tiny = [bytearray(10)]
    assert db.batch_get_into_multi_buffers(keys + ["block0"], [[a, b], [bytearray(100)], tiny]) == [
        200, 100, kvengine.BUFFER_TOO_SMALL]
    assert a.tobytes() == b"K" * 100 and b.tobytes() == b"V" * 100
    # Duplicate keys in one put are refused as a whole (engine rule), per key.
    assert db.batch_put_from_multi_buffers(["d", "d"], [[b"1"], [b"2"]]) == [-2, -2]
    assert db.is_exist("d") == 0


def test_batch_get_into_groups_reports_each_group_in_order(db):
    """A layer-wise load: on_ready(g, results) in group order, each group's bytes in."""
    keys = ["L%d/b%d" % (l, b) for l in range(4) for b in range(3)]
    assert db.batch_put_from_multi_buffers(
        keys, [[("%s|" % k).encode() * 50] for k in keys]) == [0] * len(keys)
    keys.insert(4, "L1/absent")
    ends = [3, 7, 7, 10, 13]  # group 2 is empty
    outs = [bytearray(4096) for _ in keys]
    seen = []

    def on_ready(g, results):
        first = 0 if g == 0 else ends[g - 1]
        for k, out, r in zip(keys[first:ends[g]], outs[first:ends[g]], results):
            if k.endswith("absent"):
                assert r == kvengine.NOT_FOUND
            else:
                assert bytes(out[:r]) == ("%s|" % k).encode() * 50
        seen.append((g, len(results)))

    got = db.batch_get_into_groups(keys, [[o] for o in outs], None, ends, on_ready)
    assert seen == [(0, 3), (1, 4), (2, 0), (3, 3), (4, 3)]
    assert got[4] == kvengine.NOT_FOUND
    assert [r for i, r in enumerate(got) if i != 4] == [len(k) * 50 + 50 for k in keys if
                                                        not k.endswith("absent")]
    # Without a callback; with groups that fall or stop short: refused, nothing reported.
    assert db.batch_get_into_groups(keys, [[o] for o in outs], None, ends) == got
    seen.clear()
    for bad in ([3, 2, 13], [3, 7]):
        assert db.batch_get_into_groups(keys, [[o] for o in outs], None, bad, on_ready) == [
            kvengine.INVALID_ARGUMENT] * len(keys)
    assert seen == []

    # An exception in on_ready stops the reports and is raised after the load.
    def boom(g, results):
        seen.append(g)
        raise KeyError("layer %d" % g)

    with pytest.raises(KeyError):
        db.batch_get_into_groups(keys, [[o] for o in outs], None, ends, boom)
    assert seen == [0]


def test_large_batch(db):
    n = 4096
    keys = ["big/%06d" % i for i in range(n)]
    data = np.arange(n * 256, dtype=np.uint8).reshape(n, 256)
    assert db.batch_put_from(keys, list(data)) == [0] * n
    out = np.zeros_like(data)
    assert db.batch_get_into(keys, list(out)) == [256] * n
    assert np.array_equal(out, data)
    assert db.batch_remove(keys) == [0] * n


def test_too_many_keys_is_refused_per_key(db_path):
    with kvengine.open(db_path, max_batch_size=4, **SMALL) as db:
        assert db.batch_put_from(list("abcde"), [b"x"] * 5) == [kvengine.INVALID_ARGUMENT] * 5
        assert db.batch_is_exist(list("abcde")) == [kvengine.INVALID_ARGUMENT] * 5
        assert db.batch_is_exist(list("abcd")) == [0] * 4


def test_register_buffer(db):
    arena = np.zeros(1 << 20, dtype=np.uint8)
    assert db.register_buffer(arena.ctypes.data, arena.nbytes) == 0
    overlap = db.register_buffer(arena.ctypes.data + 4096, 4096)
    assert overlap == kvengine.INVALID_ARGUMENT
    arena[:4] = [1, 2, 3, 4]
    assert db.put_from("reg", arena.ctypes.data, 4) == 0
    assert db.unregister_buffer(arena.ctypes.data) == 0
    assert db.unregister_buffer(arena.ctypes.data) == kvengine.NOT_FOUND
    # Object form: the buffer stays pinned while registered.
    ba = bytearray(8192)
    assert db.register_buffer(ba) == 0
    with pytest.raises(BufferError):
        ba.extend(b"x")  # cannot be resized while the store holds it
    assert db.unregister_buffer(ba) == 0
    ba.extend(b"x")
    assert db.get("reg") == b"\x01\x02\x03\x04"


# ------------------------------------------------------------------ bad input


BAD_CALLS = [
    ("put", lambda db: db.put(123, b"v"), TypeError),
    ("put", lambda db: db.put("k", "a str value"), TypeError),
    ("put", lambda db: db.put("k", 3.5), TypeError),
    ("put", lambda db: db.put("k", np.arange(10)[::2]), ValueError),
    ("put_from", lambda db: db.put_from("k", 0, 10), ValueError),
    ("put_from", lambda db: db.put_from("k", -1, 10), ValueError),
    ("put_from", lambda db: db.put_from("k", 4096, -1), ValueError),
    ("put_from", lambda db: db.put_from("k", 2**64 - 8, 64), ValueError),
    ("put_from", lambda db: db.put_from("k", 4096, "10"), TypeError),
    ("put_from", lambda db: db.put_from("k", 1.5, 10), TypeError),
    ("get_into", lambda db: db.get_into("k", b"read-only bytes"), TypeError),
    ("get_into", lambda db: db.get_into("k", 0, 8), ValueError),
    ("batch_put_from", lambda db: db.batch_put_from("k", [b"v"]), TypeError),
    ("batch_put_from", lambda db: db.batch_put_from(["a", "b"], [b"v"]), ValueError),
    ("batch_put_from", lambda db: db.batch_put_from(["a"], [4096], [1, 2]), ValueError),
    ("batch_put_from", lambda db: db.batch_put_from(["a"], [4096]), TypeError),
    ("batch_put_from", lambda db: db.batch_put_from(["a", "b"], [b"1", 0], [1, 1]), TypeError),
    ("batch_put_from", lambda db: db.batch_put_from(["a", 7], [b"1", b"2"]), TypeError),
    ("batch_put_from", lambda db: db.batch_put_from(["a", "b"], [b"1", None]), TypeError),
    ("batch_get_into", lambda db: db.batch_get_into(["a"], [b"ro"]), TypeError),
    ("batch_get_into", lambda db: db.batch_get_into(["a", "b"], [bytearray(1)]), ValueError),
    ("multi_put", lambda db: db.batch_put_from_multi_buffers(["a"], [[4096, 4096]], [[8]]),
     ValueError),
    ("multi_put", lambda db: db.batch_put_from_multi_buffers(["a"], [b"x"]), TypeError),
    ("multi_put", lambda db: db.batch_put_from_multi_buffers(["a", "b"], [[b"x"]]), ValueError),
    ("multi_put", lambda db: db.batch_put_from_multi_buffers(["a"], [[0]], [[5]]), ValueError),
    ("multi_get", lambda db: db.batch_get_into_multi_buffers(["a"], [[bytearray(1), b"ro"]]),
     TypeError),
    ("multi_get", lambda db: db.batch_get_into_multi_buffers(["a"], [[1]], [[1], [1]]),
     ValueError),
    ("is_exist", lambda db: db.batch_is_exist([b"ok", 3]), TypeError),
    ("register", lambda db: db.register_buffer(0, 100), ValueError),
    ("register", lambda db: db.register_buffer(4096), TypeError),
]


@pytest.mark.parametrize("name, call, exc", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_and_changes_nothing(db, name, call, exc):
    db.put("a", b"original")
    before = db.stats()
    with pytest.raises(exc):
        call(db)
    assert db.get("a") == b"original"
    assert db.batch_is_exist(["b", "k"]) == [0, 0]
    after = db.stats()
    for counter in ("puts", "put_bytes", "deletes"):
        assert after[counter] == before[counter], counter
    assert after["memory"]["items"] == before["memory"]["items"]


def test_engine_level_key_errors_are_codes(db):
    assert db.put("", b"v") == kvengine.INVALID_ARGUMENT
    assert db.batch_put_from(["", "ok"], [b"1", b"2"]) == [kvengine.INVALID_ARGUMENT, 0]
    assert db.batch_is_exist(["", "ok"]) == [kvengine.INVALID_ARGUMENT, 1]
    with pytest.raises(kvengine.Error) as e:
        db[""] = b"x"
    assert e.value.code == kvengine.INVALID_ARGUMENT


def test_no_space_without_eviction(db_path):
    with kvengine.open(db_path, memory_capacity_bytes="4MiB", memory_slab_size="1MiB",
                       memory_eviction="none", prefault_memory=False) as db:
        big = np.zeros(1 << 20, np.uint8)
        results = db.batch_put_from(["v%d" % i for i in range(8)], [big] * 8)
        assert results[0] == 0
        assert kvengine.NO_SPACE in results
        assert set(results) <= {0, kvengine.NO_SPACE}


# ------------------------------------------------------------------ threads and lifetime


def test_threads_calling_concurrently(db):
    errors = []

    def worker(t):
        try:
            rng = np.random.default_rng(t)
            for it in range(50):
                keys = ["t%d/i%d/k%d" % (t, it, j) for j in range(8)]
                vals = [rng.integers(0, 255, 8192, dtype=np.uint8) for _ in keys]
                assert db.batch_put_from(keys, vals) == [0] * 8
                outs = [np.zeros(8192, np.uint8) for _ in keys]
                assert db.batch_get_into(keys, outs) == [8192] * 8
                assert all(np.array_equal(a, b) for a, b in zip(vals, outs))
                assert db.batch_remove(keys[:4]) == [0] * 4
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert db.stats()["memory"]["items"] == 8 * 50 * 4


def test_close_while_threads_run(db_path):
    db = kvengine.open(db_path, **SMALL)
    stop = threading.Event()
    seen = set()

    def reader():
        buf = bytearray(4096)
        while not stop.is_set():
            seen.add(db.put("x", b"y" * 100))
            seen.add(db.get_into("x", buf))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    db.close()
    stop.set()
    for t in threads:
        t.join()
    assert seen <= {0, 100, kvengine.ABORTED}


def test_buffers_released_after_calls(db):
    ba = bytearray(100)
    db.put("k", ba)
    db.get_into("k", ba)
    db.batch_get_into_multi_buffers(["k"], [[ba]])
    ba.extend(b"more")  # would raise BufferError if a view leaked
    del db
    gc.collect()


def test_binding_entry_points_are_timed(db_path):
    """With perf_level=all, the binding's own perf keys (layer python) count its calls."""
    import kvengine
    from conftest import SMALL
    with kvengine.DB(db_path, **dict(SMALL, perf_level="all")) as d:
        assert d.put("p.0", b"x" * 4096) == 0
        assert d.batch_is_exist(["p.0", "p.1"]) == [1, 0]
        perf = d.perf()["keys"]
        assert perf["py_put"]["layer"] == "python"
        assert perf["py_put"]["count"] == 1
        assert perf["py_batch_exists"]["count"] == 1
        assert perf["py_batch_put"]["count"] == 0


def test_read_through_get_of_a_peer_only_key(tmp_path):
    # get() sizes its bytes object with the value's size, which must read through to the
    # peers like the read itself (it returned b"" for a key only a peer held).
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    owner = kvengine.DB(str(tmp_path / "owner"), listen=f"127.0.0.1:{port}", **SMALL)
    try:
        value = bytes(range(256)) * 1000
        assert owner.put("prefix/0", value) == 0
        reader = kvengine.DB(str(tmp_path / "reader"), peers=f"127.0.0.1:{port}",
                             peer_mode="read_through", **SMALL)
        try:
            assert reader.get_size("prefix/0") == len(value)
            assert reader.get("prefix/0") == value
            assert reader.get("absent") == b""
        finally:
            reader.close()
    finally:
        owner.close()


# ------------------------------------------------------------------ prefetch


def test_batch_prefetch_brings_ssd_values_up_for_the_next_read(db_path):
    opts = dict(SMALL, ssd_capacity_bytes="64MiB", use_direct_io=False, promote_on_read=False)
    keys = ["pf/%d" % i for i in range(8)]
    values = [os.urandom(32 << 10) for _ in keys]
    with kvengine.open(db_path, **opts) as db:
        for k, v in zip(keys, values):
            assert db.put(k, v) == 0
    with kvengine.open(db_path, **opts) as db:  # reopened: every value is on SSD only
        assert db.batch_prefetch(keys + ["absent", ""]) == [1] * len(keys) + [
            0, kvengine.INVALID_ARGUMENT]
        for k, v in zip(keys, values):
            assert db.get(k) == v
        stats = db.stats()
        assert stats["ssd_hits"] == 0
        assert stats["prefetch_hits"] == len(keys)
        with pytest.raises(TypeError):
            db.batch_prefetch(None)
    assert db.batch_prefetch(keys) == [kvengine.ABORTED] * len(keys)  # closed


def test_batch_leading_exist_counts_the_keys_present_from_the_first(db_path):
    db = kvengine.DB(db_path, **SMALL)
    for k in ("p0", "p1", "p3"):
        db.put(k, b"v")
    assert db.batch_leading_exist(["p0", "p1", "p2", "p3"]) == 2  # stops at the hole
    assert db.batch_leading_exist(["p0", "p1"]) == 2
    assert db.batch_leading_exist(["p2", "p0"]) == 0
    assert db.batch_leading_exist([]) == 0
    with pytest.raises(TypeError):
        db.batch_leading_exist("p0")
    db.close()
    assert db.batch_leading_exist(["p0"]) == kvengine.ABORTED  # could not ask, not "none"


def test_printable_key_shows_a_long_key_as_the_library_does():
    """printable_key is the library's Printable: a 64 KiB key becomes 64 bytes, its
    length and its hash (issue #49 item 4), and the adapters' logs use it."""
    short = kvengine.printable_key("layer.0\x00")
    assert short == "'layer.0\\x00'"
    long_key = "k" * 65536 + "a"
    shown = kvengine.printable_key(long_key)
    assert len(shown) < 140 and shown.startswith("'" + "k" * 64 + "...' (65537 bytes, hash ")
    assert shown != kvengine.printable_key("k" * 65536 + "b")
    assert kvengine.printable_key(long_key.encode()) == shown


def test_rendezvous_owners_rank_members_as_the_cluster_does():
    """rendezvous_owners is the library's TopOwners (test_cluster_placement.py checks it
    against where real members put keys): the same owners whatever the members' order,
    R = 1 is R = 2's first, R caps at the members, and removing a member that does not
    own a key leaves its owners alone."""
    members = ["10.0.0.%d:7400" % i for i in range(1, 6)]
    for i in range(50):
        key = "llama@tp0/L%d/%08x" % (i % 4, i * 2654435761 % (1 << 32))
        two = kvengine.rendezvous_owners(key, members, 2)
        assert len(set(two)) == 2 and set(two) <= set(members)
        assert kvengine.rendezvous_owners(key, members[::-1], 2) == two
        assert kvengine.rendezvous_owners(key.encode(), members, 1) == two[:1]
        assert sorted(kvengine.rendezvous_owners(key, members, 9)) == sorted(members)
        others = [m for m in members if m not in two]
        assert kvengine.rendezvous_owners(key, [m for m in members if m != others[0]], 2) == two
    spread = {kvengine.rendezvous_owners("k%d" % i, members)[0] for i in range(200)}
    assert spread == set(members)  # every member owns some keys
    with pytest.raises(ValueError, match="replicas"):
        kvengine.rendezvous_owners("k", members, 0)
    with pytest.raises(TypeError, match="members"):
        kvengine.rendezvous_owners("k", "10.0.0.1:7400")
