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


def test_attach_without_owner_raises(db_path):
    with pytest.raises(kvengine.Error):
        kvengine.attach(db_path + ".nothing.sock")
