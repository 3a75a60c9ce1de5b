"""kvengine as an LMCache L2 store, through LMCache's native plug-in (docs/lmcache.md).

LMCache (multiprocess mode) loads it with

    --l2-adapter '{"type": "native_plugin", "module_path": "kvengine.lmcache",
                   "class_name": "KVEngineL2Plugin",
                   "adapter_params": {"path": "/var/lib/kvcache",
                                      "memory_capacity_bytes": "64GiB"}}'

and wraps it in its NativeConnectorL2Adapter.  Every LMCache process of the host naming
the same path shares one store (kvengine.shared_store): the first opens it and serves
the others, which attach; when that owner exits, another takes the store over.

The submits, the engine's batch calls and the eventfd are C++ (_kvengine.LMCachePlugin,
python/src/lmcache_plugin.cc): a submit only queues the batch and returns its future id,
with the GIL released, and the plug-in's worker threads copy between LMCache's buffers
and the store.
"""

import os

from . import _kvengine
from .shared_store import acquire_store, release_store

__all__ = ["KVEngineL2Plugin"]

_OWNER_PROBE = "kvengine/owner-probe"


def _lost_owner(error):
    return "IOError" in error or "io_error" in error


class KVEngineL2Plugin(_kvengine.LMCachePlugin):
    """LMCache's native plug-in surface over a kvengine store.

    Keyword arguments (LMCache's adapter_params):
      path              a DB directory, shared by the LMCache processes of the host, or
      attach            the Unix socket of a kv_server (kv_server --local_listen=...);
                        exactly one of the two.
      num_workers       threads running the batches (default 4).
      part_bytes        a set or get larger than this is cut into parts the threads run
                        side by side (default 64 MiB).
      register_buffers  register each buffer with the store on first sight (default
                        False; docs/lmcache.md says why).
      anything else     a kvengine option (kvengine.OPTION_NAMES), e.g.
                        memory_capacity_bytes="64GiB", ssd_path=...

    Methods (LMCache's NativeConnectorL2Adapter calls them): event_fd(),
    submit_batch_set/get(keys, memoryviews), submit_batch_exists/delete(keys), each
    returning a future id at once; drain_completions() -> [(future_id, ok, error,
    per-key bools or None)]; close().
    """

    def __init__(self, path=None, attach=None, num_workers=4, register_buffers=False,
                 part_bytes=64 << 20, **options):
        if (path is None) == (attach is None):
            raise ValueError("KVEngineL2Plugin needs exactly one of path (a DB directory) "
                             "or attach (a kv_server socket)")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int):
            raise TypeError("num_workers must be an int")
        if not isinstance(register_buffers, bool):
            raise TypeError("register_buffers must be a bool")
        if isinstance(part_bytes, bool) or not isinstance(part_bytes, int):
            raise TypeError("part_bytes must be an int")
        if part_bytes <= 0:
            raise ValueError("part_bytes must be positive")
        path = os.fspath(path) if path is not None else None
        self._store_name = attach or path
        self._shared = acquire_store(path, attach, options)
        try:
            super().__init__(self._shared.handle, num_workers, register_buffers, part_bytes)
        except BaseException:
            release_store(self._store_name)
            raise
        self._released = False

    def drain_completions(self):
        done = super().drain_completions()
        for _, ok, error, _ in done:
            if not ok and _lost_owner(error):
                self._follow_owner()
                break
        return done

    def _follow_owner(self):
        # SharedStore takes the store over (or attaches to whoever did) when this call
        # finds the owner gone; later batches go to the store it then holds.
        self._shared.is_exist(_OWNER_PROBE)
        self._set_store(self._shared.handle)

    def close(self):
        super().close()
        if not self._released:
            self._released = True
            release_store(self._store_name)
