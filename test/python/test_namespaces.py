"""Namespaces through the Python module (docs/python.md, "Namespaces"), on a real DB."""
import gc
import os
import threading
import time

import numpy as np
import pytest

import kvengine
from conftest import SMALL


def test_a_namespace_has_the_whole_api_over_its_own_keys(db):
    a = db.create_namespace("tenant-a")
    b = db.create_namespace("tenant-b", memory_quota_bytes=1 << 20, weight=3)
    assert a.read_removals()[0] == []  # the feed records from its first reader on
    assert isinstance(a, kvengine.Namespace) and isinstance(a, kvengine.DB)
    assert a.name == "tenant-a" and db.namespace_name is None
    # The same key in three keyspaces: three values.
    assert db.put("k", b"default") == 0
    assert a.put("k", b"aaa") == 0
    assert b.put("k", b"bb") == 0
    assert (db.get("k"), a.get("k"), b.get("k")) == (b"default", b"aaa", b"bb")
    assert a["k"] == b"aaa" and "k" in a and "only-a" not in b
    a["only-a"] = b"x"
    assert b.is_exist("only-a") == 0 and db.is_exist("only-a") == 0
    assert a.get_size("k") == 3
    # Batches and zero copy, from buffers and raw pointers.
    keys = ["p%d" % i for i in range(4)]
    src = [np.full(64, i, dtype=np.uint8) for i in range(4)]
    assert a.batch_put_from(keys, src) == [0] * 4
    assert b.batch_is_exist(keys) == [0] * 4
    dst = [np.zeros(64, dtype=np.uint8) for _ in keys]
    assert a.batch_get_into(keys, dst) == [64] * 4
    assert all((d == s).all() for d, s in zip(dst, src))
    halves = [[np.full(32, i, dtype=np.uint8), np.full(32, 9, dtype=np.uint8)] for i in range(4)]
    assert b.batch_put_from_multi_buffers(keys, halves) == [0] * 4
    out = [[np.zeros(32, dtype=np.uint8), np.zeros(32, dtype=np.uint8)] for _ in keys]
    assert b.batch_get_into_multi_buffers(keys, out) == [64] * 4
    assert out[2][0][0] == 2 and out[2][1][0] == 9
    buf = bytearray(64)
    assert a.get_into("p1", buf) == 64 and buf[0] == 1
    assert a.batch_leading_exist(keys + ["absent"]) == 4
    assert a.batch_locate(["p0", "absent"]) == [1, 0]
    # Deletes stay inside the namespace.
    assert a.remove("k") == 0
    assert (db.get("k"), b.get("k")) == (b"default", b"bb")
    assert b.remove_by_regex("p[01]") == 2
    assert a.batch_is_exist(["p0", "p1"]) == [1, 1]
    assert a.remove_all() == 5  # only-a, p0..p3
    assert b.batch_is_exist(["k", "p2", "p3"]) == [1, 1, 1]
    assert db.get("k") == b"default"
    # Its removal events carry its own keys.
    events, _, _ = a.read_removals()
    assert b"only-a" in {e[4] for e in events}
    assert all(not e[4].startswith(b"\xfe") for e in events)
    # The DB's properties, and the namespace's name.
    assert a.get_property("kvengine.namespace") == "tenant-a"
    assert a.stats() == db.stats() or a.stats().keys() == db.stats().keys()
    a.close()
    b.close()


def test_list_open_drop_and_reopen(db_path):
    db = kvengine.DB(db_path, **SMALL)
    db.create_namespace("x", ssd_quota_bytes=4096, weight=7).close()
    listed = db.list_namespaces()
    assert [(n["name"], n["ssd_quota_bytes"], n["weight"], n["dropping"]) for n in listed] == \
        [("x", 4096, 7, False)]
    assert listed[0]["id"] > 0
    x = db.open_namespace("x")
    assert x.put("k", b"v") == 0 and x.flush() == 0
    db.close()
    # The registry survives a restart; an old handle fails cleanly.
    assert x.get("k") == b"" and x.put("k", b"w") == kvengine.ABORTED
    db = kvengine.DB(db_path, **SMALL)
    assert [n["name"] for n in db.list_namespaces()] == ["x"]
    x2 = db.open_or_create_namespace("x", weight=1)  # opened: its options stay
    assert db.list_namespaces()[0]["weight"] == 7
    y = db.open_or_create_namespace("y")
    assert y.put("k", b"yy") == 0
    assert db.drop_namespace("y") == 1
    assert y.get("k") == b"" and y.put("k", b"v") == kvengine.ABORTED
    with pytest.raises(kvengine.Error) as e:
        y.read("k")
    assert e.value.code == kvengine.ABORTED
    with pytest.raises(kvengine.Error) as e:
        db.open_namespace("y")
    assert e.value.code == kvengine.NOT_FOUND
    assert db.drop_namespace("y") == kvengine.NOT_FOUND
    assert [n["name"] for n in db.list_namespaces()] == ["x"]
    x2.close()
    db.close()


@pytest.mark.parametrize("call, exc, code", [
    (lambda db: db.create_namespace(7), TypeError, None),
    (lambda db: db.create_namespace(b"bytes"), TypeError, None),
    (lambda db: db.create_namespace("n", memory_quota_bytes=-1), ValueError, None),
    (lambda db: db.create_namespace("n", weight=1 << 40), ValueError, None),
    (lambda db: db.create_namespace("n", weight="2"), TypeError, None),
    (lambda db: db.create_namespace("bad/name"), kvengine.Error, kvengine.INVALID_ARGUMENT),
    (lambda db: db.create_namespace(""), kvengine.Error, kvengine.INVALID_ARGUMENT),
    (lambda db: db.create_namespace("default"), kvengine.Error, kvengine.INVALID_ARGUMENT),
    (lambda db: db.create_namespace("n", weight=0), kvengine.Error, kvengine.INVALID_ARGUMENT),
    (lambda db: db.create_namespace("n", weight=1001), kvengine.Error,
     kvengine.INVALID_ARGUMENT),
    (lambda db: db.open_namespace("missing"), kvengine.Error, kvengine.NOT_FOUND),
    (lambda db: db.drop_namespace(None), TypeError, None),
])
def test_bad_input_raises_and_changes_nothing(db, call, exc, code):
    with pytest.raises(exc) as e:
        call(db)
    if code is not None:
        assert e.value.code == code and e.value.code_name == kvengine.error_name(code)
    assert db.list_namespaces() == []


def test_a_name_that_exists_and_a_namespace_in_a_namespace_are_refused(db):
    a = db.create_namespace("a")
    with pytest.raises(kvengine.Error) as e:
        db.create_namespace("a")
    assert e.value.code == kvengine.INVALID_ARGUMENT and "a" in str(e.value)
    with pytest.raises(kvengine.Error):
        a.create_namespace("inner")
    assert a.drop_namespace("a") == kvengine.INVALID_ARGUMENT
    with pytest.raises(TypeError):
        a.setup("/tmp/elsewhere")
    assert [n["name"] for n in db.list_namespaces()] == ["a"]


def test_a_closed_store_refuses_cleanly(db_path):
    db = kvengine.DB(db_path, **SMALL)
    db.close()
    with pytest.raises(kvengine.Error) as e:
        db.create_namespace("a")
    assert e.value.code == kvengine.ABORTED
    with pytest.raises(kvengine.Error):
        db.list_namespaces()
    assert db.drop_namespace("a") == kvengine.ABORTED


def test_handles_outlive_their_db_object(db_path):
    """The DB object collected (its destructor closes the DB) while handles live on: every
    call of theirs fails ABORTED, none crashes."""
    db = kvengine.DB(db_path, **SMALL)
    a = db.create_namespace("a")
    buf = bytearray(4096)
    assert a.register_buffer(buf) == 0
    del db
    gc.collect()
    assert a.put("k", b"v") == kvengine.ABORTED
    assert a.get("k") == b""
    assert a.batch_put_from(["k"], [b"v"]) == [kvengine.ABORTED]
    assert a.batch_get_into(["k"], [bytearray(1)]) == [kvengine.ABORTED]
    assert a.batch_is_exist(["k"]) == [kvengine.ABORTED]
    assert a.batch_leading_exist(["k"]) == kvengine.ABORTED
    assert a.remove_all() == kvengine.ABORTED
    assert a.remove_by_regex(".*") == kvengine.ABORTED
    assert a.read_removals() == kvengine.ABORTED
    assert a.stats() == {}
    with pytest.raises(kvengine.Error):
        a["k"]
    assert a.close() == 0 and a.close() == 0
    assert a.put("k", b"v") == kvengine.ABORTED


def test_closing_a_handle_leaves_the_db_and_its_buffers_working(db):
    a = db.create_namespace("a")
    buf = np.arange(256, dtype=np.uint8)
    assert a.register_buffer(buf) == 0
    assert a.put_from("k", buf) == 0
    assert a.close() == 0
    assert a.get("k") == b""  # closed handle
    # The registration went with the handle; the DB can register the same memory again.
    assert db.register_buffer(buf) == 0
    assert db.unregister_buffer(buf) == 0
    a2 = db.open_namespace("a")
    assert a2.get("k") == bytes(range(256))


def test_calls_racing_the_db_close_never_crash(db_path):
    db = kvengine.DB(db_path, **SMALL)
    handles = [db.create_namespace("n%d" % i) for i in range(2)]
    stop = threading.Event()
    codes = set()

    def hammer(ns):
        value = np.zeros(4096, dtype=np.uint8)
        i = 0
        while not stop.is_set():
            codes.add(ns.put("k%d" % (i % 64), value))
            ns.batch_is_exist(["k0", "k1"])
            ns.get("k%d" % (i % 64))
            i += 1

    threads = [threading.Thread(target=hammer, args=(h,)) for h in handles for _ in range(2)]
    for t in threads:
        t.start()
    threading.Event().wait(0.2)
    db.close()
    deadline = time.monotonic() + 30  # a bound on a stalled machine, not a timing check
    while kvengine.ABORTED not in codes and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert codes <= {0, kvengine.ABORTED} and kvengine.ABORTED in codes


def test_an_attached_process_gets_a_namespace_or_a_clear_refusal(db_path):
    """shared_store.acquire_store(namespace=...) in a process attached to the owner: the
    attach protocol has no namespaces yet, so the refusal must name the namespace and
    the socket (and never touch the default keyspace); once attach carries namespaces,
    the namespace's keys must stay its own."""
    from test_attach import OWNER_OPTIONS, run_child
    sock = os.path.join(os.path.dirname(db_path), os.path.basename(db_path) + ".sock")
    with kvengine.DB(db_path, local_listen=sock, **OWNER_OPTIONS) as owner:
        owner.put("k", b"default")
        out = run_child("""
            import sys, kvengine
            from kvengine import shared_store
            try:
                ns = shared_store.acquire_store(None, sys.argv[1], {}, "tenant-x")
            except kvengine.Error as e:
                assert e.code == kvengine.NOT_SUPPORTED, e
                assert "tenant-x" in str(e) and sys.argv[1] in str(e), str(e)
                assert sys.argv[1] not in shared_store._stores  # released
                print("refused")
            else:
                assert ns.get("k") == b"" and ns.put("k", b"ns") == 0
                shared_store.release_store(sys.argv[1], ns)
                print("served")
            """, sock)
        assert out.strip() in ("refused", "served")
        assert owner.read("k") == b"default"
