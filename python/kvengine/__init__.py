"""kvengine: an embedded key-value store for the attention KV cache of LLM servers.

    import kvengine
    with kvengine.open("/var/lib/kvcache", memory_capacity_bytes="8GiB") as db:
        db.put("llama@tp0/3f9a", b"...")          # 0, or a negative error code
        db.get("llama@tp0/3f9a")                   # bytes (b"" when absent)
        db.batch_get_into(keys, [bytearray(n) for _ in keys])   # bytes read per key

Two styles, one object (docs/python.md has the full reference):

* The store API, with the names and return conventions of Mooncake Store's Python API
  (setup/close, put/get, put_from/get_into with raw pointers, the batch_* calls,
  is_exist, remove, ...): engine failures come back as negative integers, one per key in
  batch calls (see ERROR_CODES).
* Pythonic forms: buffers instead of raw pointers (bytes, bytearray, memoryview, numpy
  arrays, torch tensors on the CPU, or on a CUDA device when CUDA_BUILD is true: the
  engine then moves the bytes between the device and its memory tier), ``db[key]`` / ``key in db`` / ``del db[key]`` that raise,
  a context manager, ``stats()`` / ``perf()`` / ``options()`` as dicts.

Arguments that are wrong in themselves (type, a null pointer, lists of different lengths,
a read-only destination) raise TypeError or ValueError before the engine is called:
nothing changes.  The GIL is released during every engine call.
"""

import json
import os

from . import _kvengine
from ._kvengine import CUDA_BUILD, ERROR_CODES, OPTION_NAMES, Error, LoadPlanner

__all__ = ["DB", "Namespace", "open", "attach", "Error", "ERROR_CODES", "OPTION_NAMES", "CUDA_BUILD", "check",
           "error_name", "regex_escape", "printable_key", "rendezvous_owners", "LoadPlanner",
           "LOCATED_MEMORY", "LOCATED_SSD", "LOCATED_PEER"]
__version__ = "0.1.0"

# The negative codes of status.h, frozen: they are part of the API.
OK = 0
NOT_FOUND = -1
INVALID_ARGUMENT = -2
CORRUPTION = -3
IO_ERROR = -4
NO_SPACE = -5
BUSY = -6
ABORTED = -7
NOT_SUPPORTED = -8
BUFFER_TOO_SMALL = -9

# batch_locate's answers for a present key (include/kvengine/db.h, LocatedTier), frozen;
# 0 is absent.  LoadPlanner's key_tiers take them.
LOCATED_MEMORY = 1
LOCATED_SSD = 2
LOCATED_PEER = 3


def error_name(code):
    """The stable name of a result code: 0 -> "ok", -1 -> "not_found", ..."""
    if code > 0:
        return "ok"
    return ERROR_CODES.get(code, "unknown(%d)" % code)


def printable_key(key):
    """key (str or bytes) as kvengine's messages and log lines show it: quoted, at most
    64 bytes, escaped, and for a longer key its length and hash -- the C++ library's
    Printable, so that a key reads the same in every layer's log."""
    if isinstance(key, str):
        key = key.encode("utf-8", "surrogateescape")
    return _kvengine.printable_key(bytes(key))


def rendezvous_owners(key, members, replicas=1):
    """The members (endpoints, "host:port", as the cluster lists them) that own key in a
    sharded cluster of these members with cluster_replicas=replicas: the first replicas
    of key's rendezvous order, best first, as every member and cluster client computes it
    (docs/cluster.md, "Routing").  For routers that send a request to where its prefix
    lives, and for checking where a cluster put a key."""
    if isinstance(key, str):
        key = key.encode("utf-8", "surrogateescape")
    if isinstance(members, str):
        raise TypeError("members must be a list of endpoints, not one string")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError("replicas must be an int >= 1, not %r" % (replicas,))
    return _kvengine.rendezvous_owners(bytes(key), list(members), replicas)


def regex_escape(text):
    """text with the regex metacharacters escaped (remove_by_regex takes RE2's
    syntax), so that it matches itself."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in text)


def _make_error(code, what):
    err = Error("%s: %s" % (what, error_name(code)))
    err.code = code
    err.code_name = error_name(code)
    return err


def check(code, what="kvengine call"):
    """Returns code when it is a success (>= 0), else raises kvengine.Error for it."""
    if code < 0:
        raise _make_error(code, what)
    return code


def _option_string(name, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise TypeError("option %s must be str, int, float or bool, not %s"
                    % (name, type(value).__name__))


def _option_strings(options):
    return {name: _option_string(name, value) for name, value in options.items()}


def _parse_lines(text):
    """'name=value' (or 'name: value') lines -> dict of str."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        for sep in ("=", ":"):
            if sep in line:
                name, value = line.split(sep, 1)
                out[name.strip()] = value.strip()
                break
    return out


class DB(_kvengine.Store):
    """A kvengine database.

    DB(path, **options) opens it (raising ValueError for an unknown option name or a bad
    value, kvengine.Error for an engine failure such as Busy when another process holds
    the directory).  When that process serves local clients (local_listen), DB(path)
    attaches to it instead, so every process of the host opening the path shares one
    store (docs/attach.md).  DB() makes an unopened store to open later with setup().
    Options are the names of kvengine::Options (OPTION_NAMES), with values as Python
    ints, floats, bools or strings in the syntax of options.h ("64MiB", "lru", ...).
    """

    def __init__(self, path=None, **options):
        super().__init__()
        if path is not None:
            self._open(os.fspath(path), _option_strings(options))

    # -------------------------------------------------------------- lifecycle
    def setup(self, path, **options):
        """Opens the store at path. Returns 0, or a negative error code of the engine
        (BUSY, INVALID_ARGUMENT for a path that is a file, CORRUPTION ...).

        An unknown option name or a malformed value raises ValueError."""
        try:
            self._open(os.fspath(path), _option_strings(options))
        except Error as e:
            return e.code
        return OK

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __repr__(self):
        state = "open" if self.is_open else "closed"
        return "kvengine.DB(%r, %s)" % (self.path, state)

    # -------------------------------------------------------------- Pythonic forms
    def __getitem__(self, key):
        return self._get_or_raise(key)

    def __setitem__(self, key, value):
        check(self.put(key, value), "put")

    def __delitem__(self, key):
        rc = self.remove(key)
        if rc == NOT_FOUND:
            raise KeyError(key)
        check(rc, "remove")

    def __contains__(self, key):
        return check(self.is_exist(key), "is_exist") == 1

    def read(self, key):
        """The value of key as bytes; KeyError when absent, kvengine.Error on failure."""
        return self._get_or_raise(key)

    def batch_put(self, keys, values):
        """Stores values[i] (any buffer or CPU tensor) under keys[i]; results per key."""
        return self.batch_put_from(keys, values)

    # -------------------------------------------------------------- introspection
    def stats(self):
        """Counters and bytes per tier ("kvengine.stats.json") as a dict, with the store's
        boot epoch ("epoch"); {} if closed."""
        text = self.get_property("kvengine.stats.json")
        if not text:
            return {}
        stats = json.loads(text)
        epoch = self.epoch()  # the store's boot epoch (docs/observability.md)
        if epoch is not None:
            stats["epoch"] = epoch
        return stats

    def epoch(self):
        """The store's boot epoch ("kvengine.epoch"): a random int drawn at each open of
        the DB, so a subscriber tells a restarted store from the one it indexed; None when
        closed or not told."""
        text = self.get_property("kvengine.epoch")
        return int(text) if text else None

    def snapshot(self, prefix=b"", max_batch=1024):
        """The resident set for a router's resync: (epoch, removal_sequence, entries),
        entries a list of (tier, key bytes), one per tier holding a key that starts with
        prefix.  Apply the removal feed's events after removal_sequence to it and it is
        exact (docs/observability.md, "Resync after a restart").  read_resident() streams
        the same in batches without holding them all."""
        entries = []
        got = self.read_resident(entries.extend, prefix, max_batch)
        if isinstance(got, int):
            raise _make_error(got, "read_resident")
        return got[0], got[1], entries

    def perf(self):
        """Per-layer perf counters as a dict, when the engine exposes "kvengine.perf".

        Returns {} when the engine has no perf property (or the store is closed)."""
        text = self.get_property("kvengine.perf.json")
        if text is None:
            text = self.get_property("kvengine.perf")
        if not text:
            return {}
        try:
            value = json.loads(text)
            return value if isinstance(value, dict) else {"perf": value}
        except ValueError:
            return _parse_lines(text)

    def options(self):
        """The options in force ("kvengine.options") as a dict of strings."""
        text = self.get_property("kvengine.options")
        return _parse_lines(text) if text else {}

    # -------------------------------------------------------------- namespaces
    def create_namespace(self, name, memory_quota_bytes=0, ssd_quota_bytes=0, weight=1):
        """Registers namespace name (docs/python.md, "Namespaces") and returns a handle on
        it: a Namespace, with this whole API, whose keys are the namespace's.  Quotas are
        bytes (0: none); weight is its share under pressure, 1 to 1000.  Raises
        kvengine.Error (INVALID_ARGUMENT for a bad name or weight or a name that exists,
        NOT_SUPPORTED on an attached store, ABORTED when closed)."""
        handle = Namespace()
        self._create_namespace(handle, name, memory_quota_bytes, ssd_quota_bytes, weight)
        return handle

    def open_namespace(self, name):
        """A handle on the existing namespace name; kvengine.Error (NOT_FOUND when there
        is none, ABORTED while it is being dropped)."""
        handle = Namespace()
        self._open_namespace(handle, name)
        return handle

    def open_or_create_namespace(self, name, memory_quota_bytes=0, ssd_quota_bytes=0,
                                 weight=1):
        """A handle on namespace name, created with these options when it does not exist
        (an existing namespace keeps its own options).  Two processes may race to create
        it: the loser opens the winner's."""
        for _ in range(2):
            try:
                return self.open_namespace(name)
            except Error as e:
                if e.code != NOT_FOUND:
                    raise
            try:
                return self.create_namespace(name, memory_quota_bytes, ssd_quota_bytes, weight)
            except Error as e:
                # Created meanwhile (INVALID_ARGUMENT "exists"): open it on the next round.
                if e.code != INVALID_ARGUMENT or not any(
                        n["name"] == name for n in self.list_namespaces()):
                    raise
        return self.open_namespace(name)


class Namespace(DB):
    """A handle on one namespace of a DB (DB.create_namespace, DB.open_namespace): the
    DB's whole API, whose keys are the namespace's alone -- a key here never matches,
    overwrites or deletes a key of the DB's default namespace or of another namespace,
    and remove_all / remove_by_regex / read_removals see only this namespace.  flush,
    register_buffer, get_property and stats() are the whole DB's.

    close() releases this handle only.  A handle outlives its DB and its namespace
    safely: once the DB is closed or the namespace dropped, its calls return ABORTED (the
    raising forms raise kvengine.Error)."""

    @property
    def name(self):
        """The namespace's name."""
        return self.namespace_name

    def setup(self, path, **options):
        raise TypeError("a namespace's handle comes from DB.create_namespace or "
                        "DB.open_namespace; it does not open a path")

    def __repr__(self):
        state = "open" if self.is_open else "closed"
        return "kvengine.Namespace(%r in %r, %s)" % (self.name, self.path, state)


def open(path, **options):  # noqa: A001 -- the module's constructor, as in dbm.open
    """Opens the DB at path; same as DB(path, **options)."""
    return DB(path, **options)


def attach(socket_path, **options):
    """Attaches to the DB another process of this host serves on the Unix socket
    socket_path (opened with local_listen=...): a DB whose calls that owner serves, with
    values copied once through its shared memory.  Of the options, peer_timeout_ms (the
    longest a call may take) matters.  Raises kvengine.Error (IOError) when no owner
    serves the path or it refuses this uid."""
    db = DB()
    db._attach(os.fspath(socket_path), _option_strings(options))
    return db
