"""One store per host (docs/python.md): the processes of a host that use kvengine (the
vLLM connector, and the other integrations) share one store.  Every user in a process
naming the same path (or attach socket) shares one handle (acquire_store); the processes
share the store itself through kvengine's attach."""

import hashlib
import logging
import os
import tempfile
import threading
import time

import kvengine

logger = logging.getLogger("kvengine.shared_store")

IO_ERROR = -4  # kvengine's IOError code: what an attached store's calls return when its
#                owner is gone
NOT_SUPPORTED = -8


def default_socket(path):
    """The Unix socket the first process opening path serves the others on: inside the
    DB directory, or (a socket path is limited to 107 bytes) in the temporary directory,
    named after the directory's absolute path."""
    path = os.path.abspath(path)
    inside = os.path.join(path, "local.sock")
    if len(inside.encode()) <= 100:
        return inside
    digest = hashlib.sha1(path.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "kvengine-%s.sock" % digest)


def _lost_owner(result):
    if isinstance(result, int):
        return result == IO_ERROR
    return isinstance(result, list) and len(result) > 0 and all(r == IO_ERROR for r in result)


class SharedStore:
    """One process's handle on a store that every process of the host shares
    (docs/vllm.md, "One store per host"), with the DB's methods.

    attach=SOCKET: a kv_server (or any process) serves the store on SOCKET; calls made
    while it is gone fail with IOError, and the engine reconnects by itself once it
    serves again.  Otherwise the first process that opens path owns the store and serves
    the others on options["local_listen"] (default_socket(path) unless given; "" turns
    sharing off).  When that owner goes away, the first call of an attached process that
    fails with IOError tries to take the store over: it opens path itself, becoming the
    owner (what the old owner flushed to SSD is there) or attaching to whichever process
    did first, and the call is made once more."""

    def __init__(self, path=None, attach=None, options=None, takeover_timeout_s=10.0):
        self._path = path
        self._attach = attach
        self._options = dict(options or {})
        self._takeover_timeout_s = takeover_timeout_s
        self._lock = threading.Lock()
        self._generation = 0
        if attach:
            self._db = kvengine.attach(attach, **self._options)
        else:
            if "local_listen" not in self._options:
                self._options["local_listen"] = default_socket(path)
            self._db = self._open()

    def _open(self):
        deadline = time.monotonic() + self._takeover_timeout_s
        while True:
            try:
                return kvengine.DB(self._path, **self._options)
            except kvengine.Error as e:
                # Busy: the directory is held by an owner that does not serve (yet): one
                # starting, or one closing and flushing.
                if e.code != -6 or not self._options.get("local_listen") or \
                        time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    @property
    def handle(self):
        """The kvengine.DB calls go to now (a new one after a take-over)."""
        return self._db

    def current(self):
        """(handle, generation): the handle calls go to now, and how many take-overs
        happened before it (a namespace's handle is re-opened on each new one)."""
        with self._lock:
            return self._db, self._generation

    @property
    def attached(self):
        """The socket this process is attached through; None when it owns the store."""
        return self._db.get_property("kvengine.attached")

    def _take_over(self, generation):
        """After a call saw the owner gone: makes sure a store is reachable again (a new
        owner, maybe this process).  False when none is."""
        with self._lock:
            if generation != self._generation:
                return True  # another thread did it
            db = self._db
            if db.is_exist("kvengine/owner-probe") >= 0:
                return True  # an owner serves again: the engine reconnected
            if self._attach or db.get_property("kvengine.attached") is None:
                return False  # a kv_server is restarted from outside; an owner's own error
            try:
                self._db = self._open()
            except kvengine.Error as e:
                logger.warning("kvengine: the store's owner is gone and %s could not be "
                               "opened: %s", self._path, e)
                return False
            self._generation += 1
            logger.warning("kvengine: the store's owner went away; this process %s %s",
                           "attached to the new owner of" if self.attached else "now owns",
                           self._path)
            # The old handle is dropped, not closed: other threads may be in a call on it.
            return True

    def __getattr__(self, name):
        method_name = name

        def call(*args):
            generation = self._generation
            result = getattr(self._db, method_name)(*args)
            if _lost_owner(result) and self._take_over(generation):
                result = getattr(self._db, method_name)(*args)
            return result

        return call

    def close(self):
        with self._lock:
            return self._db.close()


class SharedNamespace:
    """A namespace of a SharedStore (docs/python.md, "Namespaces"), with the DB's methods:
    opened, or created with `options` (memory_quota_bytes, ssd_quota_bytes, weight) when
    missing, and opened again on the store's new handle after a take-over.  Raises
    kvengine.Error when the namespace cannot be had (an attached store: NOT_SUPPORTED)."""

    def __init__(self, shared, name, options=None):
        self._shared = shared
        self.name = name
        self._options = dict(options or {})
        self._lock = threading.Lock()
        self._handle, self._generation = None, None
        try:
            self._current()
        except kvengine.Error as e:
            if e.code == NOT_SUPPORTED and shared.attached:
                e.args = ("namespace %r: this process is attached to the store's owner (%s), "
                          "and an attached client cannot open a namespace (%s)"
                          % (name, shared.attached, e),)
            raise

    def _current(self):
        """(the namespace's handle on the store's handle now, that handle's generation)."""
        db, generation = self._shared.current()
        with self._lock:
            if self._handle is None or generation != self._generation:
                # An old handle is dropped, not closed: other threads may be in a call on it.
                self._handle = db.open_or_create_namespace(self.name, **self._options)
                self._generation = generation
            return self._handle, generation

    @property
    def handle(self):
        """The kvengine.Namespace calls go to now."""
        return self._current()[0]

    def __getattr__(self, name):
        method_name = name

        def call(*args):
            handle, generation = self._current()
            result = getattr(handle, method_name)(*args)
            if _lost_owner(result) and self._shared._take_over(generation):
                result = getattr(self._current()[0], method_name)(*args)
            return result

        return call

    def close(self):
        """Releases the namespace's handle (the store stays open)."""
        with self._lock:
            handle, self._handle = self._handle, None
        return handle.close() if handle is not None else 0


_stores_lock = threading.Lock()
_stores = {}  # path or socket -> [SharedStore, users]


def acquire_store(path, attach, options, namespace=None, namespace_options=None):
    """This process's handle on the store at path (or served on the attach socket): the
    first caller opens or attaches it, later ones share it.  With `namespace`, a
    SharedNamespace of it instead (opened, or created with namespace_options).  Each call
    is matched by one release_store(attach or path, handle)."""
    name = attach or path
    with _stores_lock:
        entry = _stores.get(name)
        if entry is None:
            entry = [SharedStore(path, attach, options), 0]
            _stores[name] = entry
        entry[1] += 1
        store = entry[0]
    if namespace is None:
        return store
    try:
        return SharedNamespace(store, namespace, namespace_options)
    except BaseException:
        release_store(name)
        raise


def namespace_config(extra, where):
    """(namespace, its options) from an integration's extra config: "namespace" (a name,
    or None for the store's default keyspace) and "namespace_options" (memory_quota_bytes,
    ssd_quota_bytes, weight: used when the namespace is created).  ValueError naming
    `where` for a bad one."""
    name = extra.get("namespace")
    options = extra.get("namespace_options") or {}
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError("%s['namespace'] must be a namespace name (str), not %r"
                         % (where, name))
    allowed = ("memory_quota_bytes", "ssd_quota_bytes", "weight")
    if not isinstance(options, dict) or set(options) - set(allowed):
        raise ValueError("%s['namespace_options'] must be an object with only %s, not %r"
                         % (where, ", ".join(allowed), options))
    if options and name is None:
        raise ValueError("%s['namespace_options'] given without %s['namespace']"
                         % (where, where))
    return name, dict(options)


def release_store(name, handle=None):
    """Gives back one acquire_store's share of the handle (closing `handle` first when
    it is a SharedNamespace); the last share closes the store."""
    if isinstance(handle, SharedNamespace):
        handle.close()
    with _stores_lock:
        entry = _stores.get(name)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _stores[name]
            entry[0].close()
