"""Shared fixtures: a real DB in a fresh directory (no mocks of the engine)."""
import os
import sys
import tempfile

import pytest

# The tests import the package from the build tree (CTest sets PYTHONPATH=build/python).
# Running pytest by hand from the repository root works too.
_here = os.path.dirname(os.path.abspath(__file__))
_build = os.path.join(_here, "..", "..", "build", "python")
if "kvengine" not in sys.modules and os.path.isdir(_build) and not any(
        os.path.isdir(os.path.join(p, "kvengine")) for p in sys.path if p):
    sys.path.insert(0, os.path.abspath(_build))
sys.path.insert(0, _here)  # vllm_fakes

import kvengine  # noqa: E402

SMALL = dict(memory_capacity_bytes="64MiB", prefault_memory=False, apply_environment=False)


@pytest.fixture
def db_path(tmp_path_factory):
    base = os.environ.get("KV_TEST_TMPDIR")
    if base:
        os.makedirs(base, exist_ok=True)
        path = tempfile.mkdtemp(prefix="py_", dir=base)
        os.rmdir(path)
        return path
    return str(tmp_path_factory.mktemp("db") / "db")


@pytest.fixture
def db(db_path):
    d = kvengine.DB(db_path, **SMALL)
    yield d
    d.close()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fleet: a test of several kv_server members and their hosts' processes "
                   "(CTest runs them apart from the rest, as python_fleet_tests)")
