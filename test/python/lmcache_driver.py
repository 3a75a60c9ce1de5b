"""Drives an LMCache NativeConnectorL2Adapter (the stand-in of lmcache_fakes.py) the way
LMCache's store and prefetch controllers do: submit a task, wait on the adapter's event
fd for its category, then pop or query the result.  Used by test_lmcache_plugin.py and,
in spawned processes, by lmcache_process.py."""
import hashlib
import json
import os
import select
import time

import lmcache_fakes as lf

MODEL = "meta-llama/Llama-3.1-8B"
WAIT_S = 60  # a bound on hangs, not a timing check


def spec(**adapter_params):
    """The --l2-adapter JSON that loads kvengine's plug-in."""
    return json.dumps({"type": "native_plugin", "module_path": "kvengine.lmcache",
                       "class_name": "KVEngineL2Plugin", "adapter_params": adapter_params})


def key(i, salt=""):
    return lf.ObjectKey(chunk_hash=hashlib.sha256(b"chunk%d" % i).digest()[:16],
                        model_name=MODEL, kv_rank=lf.ObjectKey.ComputeKVRank(1, 0, 1, 0),
                        cache_salt=salt)


def chunk_bytes(i, size):
    """Distinct, reproducible bytes for chunk i."""
    seed = hashlib.sha256(b"bytes%d" % i).digest()
    return (seed * (size // len(seed) + 1))[:size]


def memory_obj(data=None, size=None, fill=0):
    obj = lf.TensorMemoryObj(len(data) if data is not None else size)
    view = obj.byte_array
    if data is not None:
        view[:] = data
    else:
        view[:] = bytes([fill]) * len(view)
    return obj


def wait(fd, poll_result):
    """Waits on fd (consuming its signal) until poll_result() returns non-None."""
    deadline = time.monotonic() + WAIT_S
    while True:
        result = poll_result()
        if result is not None:
            return result
        assert time.monotonic() < deadline, "no completion within %d s" % WAIT_S
        if select.select([fd], [], [], 0.5)[0]:
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass


def store(adapter, keys, objs):
    tid = adapter.submit_store_task(keys, objs)
    return wait(adapter.get_store_event_fd(),
                lambda: adapter.pop_completed_store_tasks().get(tid))


def lookup(adapter, keys):
    tid = adapter.submit_lookup_and_lock_task(keys, {})
    bitmap = wait(adapter.get_lookup_and_lock_event_fd(),
                  lambda: adapter.query_lookup_and_lock_result(tid))
    return bitmap.to_list()


def load(adapter, keys, objs):
    tid = adapter.submit_load_task(keys, objs)
    bitmap = wait(adapter.get_load_event_fd(), lambda: adapter.query_load_result(tid))
    return bitmap.to_list()
