"""kvengine.attach and kvengine.DB(path) attaching: the owner and the clients are real
processes sharing one store through a Unix socket and shared memory."""
import os
import subprocess
import sys
import textwrap

import pytest

import kvengine
from conftest import SMALL

OWNER_OPTIONS = dict(SMALL, ssd_capacity_bytes=0)


def run_child(code, *args):
    """Runs code in a fresh Python process (argv[1:] = args); returns its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_attach_by_socket_and_by_path(db_path):
    sock = os.path.join(os.path.dirname(db_path), os.path.basename(db_path) + ".sock")
    with kvengine.DB(db_path, local_listen=sock, **OWNER_OPTIONS) as owner:
        owner.put("from-owner", b"o" * 1000)
        out = run_child("""
            import sys, kvengine
            a = kvengine.attach(sys.argv[1])
            assert a.read("from-owner") == b"o" * 1000
            a["from-socket"] = b"s" * 5000
            b = kvengine.DB(sys.argv[2])          # the path: attaches, not Busy
            assert b.read("from-socket") == b"s" * 5000
            b["from-path"] = b"p"
            print(b.stats()["memory"]["items"])
            """, sock, db_path)
        assert int(out) == 3
        assert owner.read("from-path") == b"p"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the client as another uid")
def test_a_tenants_client_sees_only_its_own_namespaces_figures(db_path):
    """A client under uid 1001, granted tenant-a only (no '@admin'), reads its namespace's
    figures and removal feed and nothing of tenant-b (docs/attach.md, "What a client sees
    of the DB")."""
    import tempfile
    sock_dir = tempfile.mkdtemp(prefix="kv-figures-")
    os.chmod(sock_dir, 0o755)
    sock = os.path.join(sock_dir, "kv.sock")
    with kvengine.DB(db_path, local_listen=sock, local_listen_mode="0666",
                     local_allowed_uids="uid:1001=tenant-a", **OWNER_OPTIONS) as owner:
        a = owner.create_namespace("tenant-a")
        b = owner.create_namespace("tenant-b")
        assert a.read_removals(0, 0)[2] == 0  # the feed records from here on
        for i in range(5):
            b.put("b%d" % i, b"bb")
            b.remove("b%d" % i)
        a.put("mine", b"aa")
        a.put("gone", b"aa")
        a.remove("gone")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = textwrap.dedent("""
            import sys, kvengine
            db = kvengine.attach(sys.argv[1])
            stats = db.stats()
            assert sorted(stats) == ["epoch", "namespaces"], stats  # the epoch: no tenant's
            assert stats["epoch"] == int(sys.argv[2]), stats
            assert list(stats["namespaces"]) == ["tenant-a"], stats
            assert stats["namespaces"]["tenant-a"]["memory_items"] == 1, stats
            for name in ("kvengine.stats", "kvengine.stats.json", "kvengine.prometheus"):
                text = db.get_property(name)
                assert "tenant-a" in text and "tenant-b" not in text, (name, text)
            options = db.options()
            assert "memory_capacity_bytes" in options, options
            assert "local_allowed_uids" not in options, options
            assert db.get_property("kvengine.perf") is None
            assert [n["name"] for n in db.list_namespaces()] == ["tenant-a"]
            a = db.open_namespace("tenant-a")
            events, missed, last = a.read_removals()
            assert (missed, last) == (0, 1), (events, missed, last)
            assert [(e[0], e[4]) for e in events] == [(1, b"gone")], events
            print("ok")
            """)
        out = subprocess.run([sys.executable, "-c", code, sock, str(owner.epoch())], env=env,
                             user=1001, group=1001, extra_groups=[], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok"
        assert "tenant-b" in owner.get_property("kvengine.stats")


def test_attach_without_owner_raises(db_path):
    with pytest.raises(kvengine.Error):
        kvengine.attach(db_path + ".nothing.sock")


def test_a_layerwise_load_through_attach_is_one_request_to_the_owner(db_path):
    """Store.batch_get_into_groups of an attached process (the vLLM connector's worker)
    takes the owner's PIN_GROUPS path: one request for every layer, each layer reported
    in order with its bytes in (docs/attach.md, "Layer-wise loads")."""
    sock = os.path.join(os.path.dirname(db_path), os.path.basename(db_path) + ".sock")
    with kvengine.DB(db_path, local_listen=sock, **OWNER_OPTIONS) as owner:
        keys = ["L%d/b%d" % (l, b) for l in range(8) for b in range(4)]
        for k in keys:
            owner.put(k, ("%s|" % k).encode() * 300)
        before = owner.stats()["local"]["group_loads"]
        out = run_child("""
            import sys, kvengine
            a = kvengine.attach(sys.argv[1])
            keys = ["L%d/b%d" % (l, b) for l in range(8) for b in range(4)]
            ends = [4 * (l + 1) for l in range(8)]
            outs = [bytearray(8192) for _ in keys]
            seen = []
            def on_ready(g, results):
                for i in range(4 * g, 4 * g + 4):
                    assert bytes(outs[i][:results[i - 4 * g]]) == ("%s|" % keys[i]).encode() * 300
                seen.append(g)
            got = a.batch_get_into_groups(keys, [[o] for o in outs], None, ends, on_ready)
            assert seen == list(range(8)), seen
            assert got == [len(k) * 300 + 300 for k in keys], got
            print("ok")
            """, sock)
        assert out.strip() == "ok"
        assert owner.stats()["local"]["group_loads"] == before + 1
