"""Stand-ins for the parts of LMCache that load and drive a native plug-in, written to
follow LMCache main member for member (the commit and files are recorded in
docs/lmcache.md, "Conformance with LMCache main"; lmcache_conformance.py checks the
names and signatures against a real LMCache tree):

* lmcache/v1/distributed/l2_adapters/config.py: the type registry and the parser of the
  repeated --l2-adapter JSON argument (parse_args_to_l2_adapters_config).
* lmcache/v1/distributed/l2_adapters/factory.py: the factory registry.
* lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py: the "native_plugin"
  config and factory (import module_path, cls(**adapter_params), check the methods).
* lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py:
  NativeConnectorL2Adapter, with its three notifiers, its demux thread, the lock it
  holds around every submit, client-side lock refcounts and byte accounting.
* lmcache/v1/distributed/l2_adapters/base.py: the accounting and listener half of
  L2AdapterInterface.
* ObjectKey, L2StoreResult, a Bitmap and an eventfd notifier, as LMCache defines them
  (Bitmap is native in LMCache: the stand-in has the members the adapter uses).

LMCache is not installed here (and needs torch and CUDA packages); nothing of it is
imported.  Its code is not copied: these are written from what its source does.
"""

import argparse
import ctypes
import dataclasses
import importlib
import json
import os
import select
import threading
from collections import defaultdict
from types import MappingProxyType

# ------------------------------------------------------------------ lmcache.v1.distributed


@dataclasses.dataclass(frozen=True)
class ObjectKey:
    chunk_hash: bytes
    model_name: str
    kv_rank: int
    object_group_id: int = 0
    cache_salt: str = ""

    def __post_init__(self):
        if "@" in self.model_name:
            raise ValueError("model_name must not contain '@' (got %r)" % self.model_name)
        if self.object_group_id < 0:
            raise ValueError("object_group_id must be >= 0")
        if set("@/\\\x00") & set(self.cache_salt) or len(self.cache_salt) > 128:
            raise ValueError("bad cache_salt %r" % self.cache_salt)

    @staticmethod
    def ComputeKVRank(world_size, global_rank, local_world_size, local_rank):
        return (world_size << 24) | (global_rank << 16) | (local_world_size << 8) | local_rank


class L2StoreResult(int):
    """>= 0: success with that many bytes; -1: failure."""

    def __new__(cls, success, bytes_transferred):
        if bytes_transferred < 0:
            raise ValueError("bytes_transferred must be >= 0")
        return super().__new__(cls, bytes_transferred if success else -1)

    def is_successful(self):
        return int(self) >= 0

    def bytes_transferred(self):
        return max(int(self), 0)


class Bitmap:
    """lmcache.lmcache_native.Bitmap, the members the adapter and these tests use."""

    def __init__(self, size):
        self._bits = [False] * size

    def set(self, i):
        self._bits[i] = True

    def test(self, i):
        return self._bits[i]

    def popcount(self):
        return sum(self._bits)

    def to_list(self):
        return list(self._bits)


class EventfdNotifier:
    """lmcache.v1.platform's notifier on Linux: an eventfd, binary signal.  consume()
    swallows only BlockingIOError (nothing pending), as LMCache's does: EBADF from a
    closed fd propagates."""

    def __init__(self):
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self):
        return self._efd

    def notify(self):
        os.eventfd_write(self._efd, 1)

    def notify_fileno(self):
        return self._efd

    def consume(self):
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass

    def close(self):
        if self._efd >= 0:
            try:
                os.close(self._efd)
            except OSError:
                pass
            self._efd = -1


def create_event_notifier():
    return EventfdNotifier()


class TensorMemoryObj:
    """An L1 memory object: byte_array is a ctypes-backed, writable, itemsize-1
    memoryview over LMCache's own memory, as LMCache's MemoryObj.byte_array is."""

    def __init__(self, num_bytes, physical_bytes=None):
        self._physical = physical_bytes or num_bytes
        self._storage = (ctypes.c_ubyte * self._physical)()
        self._size = num_bytes

    @property
    def data_ptr(self):
        return ctypes.addressof(self._storage)

    @property
    def byte_array(self):
        view = (ctypes.c_ubyte * self._size).from_address(self.data_ptr)
        return memoryview(view).cast("B")

    def get_size(self):
        return self._size

    def get_physical_size(self):
        return self._physical


# ------------------------------------------------------------------ l2_adapters/base.py


@dataclasses.dataclass(frozen=True)
class AdapterUsage:
    total_bytes_used: int
    total_capacity_bytes: int
    bytes_by_cache_salt: dict = dataclasses.field(default_factory=dict)

    @property
    def usage_fraction(self):
        if self.total_capacity_bytes <= 0:
            return -1.0
        return self.total_bytes_used / self.total_capacity_bytes


class L2AdapterInterface:
    def __init__(self, max_capacity_bytes=0):
        self._listeners = []
        self._max_capacity_bytes = max_capacity_bytes
        self._total_bytes_used = 0
        self._bytes_by_cache_salt = {}
        self._usage_lock = threading.Lock()

    def register_listener(self, listener):
        self._listeners.append(listener)

    def _notify_keys_stored(self, keys, sizes):
        with self._usage_lock:
            for key, size in zip(keys, sizes, strict=True):
                self._total_bytes_used += size
                salt = key.cache_salt
                self._bytes_by_cache_salt[salt] = self._bytes_by_cache_salt.get(salt, 0) + size
        for listener in self._listeners:
            listener.on_l2_keys_stored(keys, sizes)

    def _notify_keys_accessed(self, keys):
        for listener in self._listeners:
            listener.on_l2_keys_accessed(keys)

    def _notify_keys_deleted(self, keys, sizes):
        with self._usage_lock:
            for key, size in zip(keys, sizes, strict=True):
                self._total_bytes_used = max(0, self._total_bytes_used - size)
                left = self._bytes_by_cache_salt.get(key.cache_salt, 0) - size
                if left <= 0:
                    self._bytes_by_cache_salt.pop(key.cache_salt, None)
                else:
                    self._bytes_by_cache_salt[key.cache_salt] = left
        for listener in self._listeners:
            listener.on_l2_keys_deleted(keys)

    @property
    def supports_global_eviction(self):
        return self._max_capacity_bytes > 0

    def delete(self, keys):
        return None

    def get_usage(self):
        with self._usage_lock:
            return AdapterUsage(
                total_bytes_used=self._total_bytes_used,
                total_capacity_bytes=self._max_capacity_bytes,
                bytes_by_cache_salt=MappingProxyType(
                    {k: v for k, v in self._bytes_by_cache_salt.items() if v > 0}))

    def report_status(self):
        return {"is_healthy": True}


# ------------------------------------------------------------------ l2_adapters/config.py

_L2_ADAPTER_CONFIG_REGISTRY = {}
_L2_ADAPTER_ARG_DEST = "l2_adapter"


def register_l2_adapter_type(name, config_cls):
    if name in _L2_ADAPTER_CONFIG_REGISTRY:
        raise ValueError("L2 adapter type already registered: %r" % name)
    _L2_ADAPTER_CONFIG_REGISTRY[name] = config_cls


def get_type_name_for_config(config):
    for name, cls in _L2_ADAPTER_CONFIG_REGISTRY.items():
        if type(config) is cls:
            return name
    raise ValueError("Unregistered L2 adapter config type: %s" % type(config).__name__)


@dataclasses.dataclass(frozen=True)
class PersistConfig:
    persist_enabled: bool = True


@dataclasses.dataclass(frozen=True)
class EvictionConfig:
    """What LMCache's lmcache.v1.distributed.config.EvictionConfig carries for an L2
    adapter (only these three fields are set from an adapter spec)."""
    eviction_policy: str
    trigger_watermark: float
    eviction_ratio: float


@dataclasses.dataclass(frozen=True)
class SerdeConfig:
    """LMCache's lmcache.v1.distributed.serde.SerdeConfig as an adapter spec fills it."""
    type: str
    kwargs: dict


class L2AdapterConfigBase:
    eviction_config = None
    shared = False
    persist_config = PersistConfig()
    serde_config = None

    @staticmethod
    def _parse_serde_config(d):
        serde = d.get("serde")
        if serde is None:
            return None
        if not isinstance(serde, dict):
            raise ValueError("'serde' must be a dict, got %s" % type(serde).__name__)
        if not isinstance(serde.get("type"), str):
            raise ValueError("'serde' dict must include a 'type' field")
        return SerdeConfig(type=serde["type"], kwargs={k: v for k, v in serde.items()
                                                        if k != "type"})

    @staticmethod
    def _parse_eviction_config(d):
        # An adapter spec without "eviction" leaves LMCache's L2 eviction off for it.
        eviction = d.get("eviction")
        if eviction is None:
            return None
        policy = eviction.get("eviction_policy")
        if policy not in ("LRU", "IsolatedLRU", "noop"):
            raise ValueError("eviction.eviction_policy must be 'LRU', 'IsolatedLRU', or "
                             "'noop', got %r" % (policy,))
        return EvictionConfig(eviction_policy=policy,
                              trigger_watermark=float(eviction.get("trigger_watermark", 0.8)),
                              eviction_ratio=float(eviction.get("eviction_ratio", 0.2)))

    @staticmethod
    def _parse_persist_config(d):
        return PersistConfig(persist_enabled=bool(d.get("persist_enabled", True)))


@dataclasses.dataclass
class L2AdaptersConfig:
    adapters: list


def add_l2_adapters_args(parser):
    group = parser.add_argument_group("L2 Adapters")
    group.add_argument("--l2-adapter", dest=_L2_ADAPTER_ARG_DEST, action="append", default=[],
                       type=str, metavar="JSON")
    return parser


def parse_args_to_l2_adapters_config(args):
    adapters = []
    for i, raw in enumerate(getattr(args, _L2_ADAPTER_ARG_DEST, None) or []):
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError("Invalid JSON for --l2-adapter #%d: %s" % (i + 1, e)) from e
        if not isinstance(d, dict):
            raise ValueError("--l2-adapter #%d: expected a JSON object" % (i + 1))
        type_name = d.get("type")
        if type_name is None:
            raise ValueError("--l2-adapter #%d: missing 'type' field" % (i + 1))
        if type_name not in _L2_ADAPTER_CONFIG_REGISTRY:
            raise ValueError("--l2-adapter #%d: unknown adapter type %r" % (i + 1, type_name))
        config_cls = _L2_ADAPTER_CONFIG_REGISTRY[type_name]
        try:
            cfg = config_cls.from_dict(d)
            cfg.shared = bool(d.get("shared", False))
            cfg.eviction_config = L2AdapterConfigBase._parse_eviction_config(d)
            cfg.persist_config = L2AdapterConfigBase._parse_persist_config(d)
            cfg.serde_config = L2AdapterConfigBase._parse_serde_config(d)
        except (TypeError, ValueError) as e:
            raise ValueError("--l2-adapter #%d (%r): %s" % (i + 1, type_name, e)) from e
        adapters.append(cfg)
    return L2AdaptersConfig(adapters=adapters)


# ------------------------------------------------------------------ l2_adapters/factory.py

_L2_ADAPTER_FACTORY_REGISTRY = {}


def register_l2_adapter_factory(name, factory):
    if name in _L2_ADAPTER_FACTORY_REGISTRY:
        raise ValueError("L2 adapter factory already registered: %s" % name)
    _L2_ADAPTER_FACTORY_REGISTRY[name] = factory


def create_l2_adapter_from_registry(config, l1_memory_desc=None):
    name = get_type_name_for_config(config)
    factory = _L2_ADAPTER_FACTORY_REGISTRY.get(name)
    if factory is None:
        raise ValueError("No adapter factory registered for type %s" % name)
    return factory(config, l1_memory_desc)


# ------------------------------------------------------------------ native_plugin_l2_adapter.py


class NativePluginL2AdapterConfig(L2AdapterConfigBase):
    def __init__(self, module_path, class_name, adapter_params=None, max_capacity_gb=0):
        self.module_path = module_path
        self.class_name = class_name
        self.adapter_params = adapter_params or {}
        self.max_capacity_gb = max_capacity_gb

    @classmethod
    def from_dict(cls, d):
        module_path = d.get("module_path")
        if not isinstance(module_path, str) or not module_path:
            raise ValueError("module_path must be a non-empty string")
        class_name = d.get("class_name")
        if not isinstance(class_name, str) or not class_name:
            raise ValueError("class_name must be a non-empty string")
        adapter_params = d.get("adapter_params", {})
        if not isinstance(adapter_params, dict):
            raise ValueError("adapter_params must be a dict")
        max_capacity_gb = d.get("max_capacity_gb", 0)
        if not isinstance(max_capacity_gb, (int, float)) or max_capacity_gb < 0:
            raise ValueError("max_capacity_gb must be a non-negative number")
        return cls(module_path=module_path, class_name=class_name,
                   adapter_params=adapter_params, max_capacity_gb=float(max_capacity_gb))

    @classmethod
    def help(cls):
        return "module_path, class_name, adapter_params, max_capacity_gb"


REQUIRED_METHODS = ["event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
                    "drain_completions", "close"]


def _create_native_plugin_l2_adapter(config, l1_memory_desc=None):
    module = importlib.import_module(config.module_path)
    connector_cls = getattr(module, config.class_name)
    native_client = connector_cls(**config.adapter_params)
    for method in REQUIRED_METHODS:
        if not callable(getattr(native_client, method, None)):
            native_client.close()
            raise TypeError("%s.%s instance missing required method '%s'"
                            % (config.module_path, config.class_name, method))
    return NativeConnectorL2Adapter(native_client, max_capacity_gb=config.max_capacity_gb,
                                    type_name="native_plugin")


# ------------------------------------------------------------------ native_connector_l2_adapter.py

_KEY_SEP = "@"


def _object_key_to_string(key):
    base = "%s%s%08x%s%x%s%s" % (key.model_name, _KEY_SEP, key.kv_rank, _KEY_SEP,
                                key.object_group_id, _KEY_SEP, key.chunk_hash.hex())
    return base + _KEY_SEP + key.cache_salt if key.cache_salt else base


def _obj_to_memoryview(obj, pad_to_physical=False):
    if pad_to_physical and isinstance(obj, TensorMemoryObj) and \
            obj.get_physical_size() > obj.get_size():
        view = (ctypes.c_ubyte * obj.get_physical_size()).from_address(obj.data_ptr)
        return memoryview(view)
    return obj.byte_array


class NativeConnectorL2Adapter(L2AdapterInterface):
    _OP_STORE = "store"
    _OP_LOOKUP = "lookup"
    _OP_LOAD = "load"
    _OP_DELETE = "delete"

    def __init__(self, native_client, max_capacity_gb=0, type_name="", extra_status=None,
                 pad_buffers_to_alignment=False, disk_guard=None):
        super().__init__(max_capacity_bytes=int(max_capacity_gb * (1024 ** 3)))
        self._disk_guard = disk_guard
        self._client = native_client
        self._client_fd = int(native_client.event_fd())
        self._type_name = type_name or type(native_client).__name__
        self._extra_status = dict(extra_status or {})
        self._pad_buffers_to_alignment = pad_buffers_to_alignment
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._pending_ops = {}        # future_id -> (op, task_id, num_keys, keys or None)
        self._completed_stores = {}
        self._completed_lookups = {}
        self._completed_loads = {}
        self._locked_keys = defaultdict(int)
        self._has_delete = callable(getattr(native_client, "submit_batch_delete", None))
        self._pending_delete_events = {}
        self._key_sizes = {}
        self._pending_store_sizes = {}
        self._next_task_id = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._demux_thread = threading.Thread(target=self._demux_loop, daemon=True,
                                              name="l2-adapter-demux")
        self._demux_thread.start()

    def get_store_event_fd(self):
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self):
        return self._lookup_efd.fileno()

    def get_load_event_fd(self):
        return self._load_efd.fileno()

    def submit_store_task(self, keys, objects):
        key_strings = [_object_key_to_string(k) for k in keys]
        memviews = [_obj_to_memoryview(o, self._pad_buffers_to_alignment) for o in objects]
        per_key_sizes = [len(mv) for mv in memviews]
        with self._lock:  # the submit runs under the lock every LMCache thread shares
            task_id = self._get_next_task_id()
            future_id = int(self._client.submit_batch_set(key_strings, memviews))
            self._pending_ops[future_id] = (self._OP_STORE, task_id, len(keys), None)
            self._pending_store_sizes[future_id] = (list(keys), per_key_sizes)
        return task_id

    def pop_completed_store_tasks(self):
        with self._lock:
            completed, self._completed_stores = self._completed_stores, {}
        return completed

    def submit_lookup_and_lock_task(self, keys, group_layout_descs):
        key_strings = [_object_key_to_string(k) for k in keys]
        with self._lock:
            task_id = self._get_next_task_id()
            future_id = int(self._client.submit_batch_exists(key_strings))
            self._pending_ops[future_id] = (self._OP_LOOKUP, task_id, len(keys), list(keys))
        return task_id

    def query_lookup_and_lock_result(self, task_id):
        with self._lock:
            return self._completed_lookups.pop(task_id, None)

    def submit_unlock(self, keys):
        with self._lock:
            for key in keys:
                if key not in self._locked_keys:
                    continue
                if self._locked_keys[key] <= 1:
                    del self._locked_keys[key]
                else:
                    self._locked_keys[key] -= 1

    def submit_load_task(self, keys, objects):
        key_strings = [_object_key_to_string(k) for k in keys]
        memviews = [_obj_to_memoryview(o, self._pad_buffers_to_alignment) for o in objects]
        with self._lock:
            task_id = self._get_next_task_id()
            future_id = int(self._client.submit_batch_get(key_strings, memviews))
            self._pending_ops[future_id] = (self._OP_LOAD, task_id, len(keys), list(keys))
        return task_id

    def query_load_result(self, task_id):
        with self._lock:
            return self._completed_loads.pop(task_id, None)

    def delete(self, keys):
        """Blocks (up to 30 s) until the demux thread has the delete's completion."""
        if not keys or not self._has_delete:
            return
        key_strings = [_object_key_to_string(k) for k in keys]
        done_event = threading.Event()
        with self._lock:
            task_id = self._get_next_task_id()
            future_id = int(self._client.submit_batch_delete(key_strings))
            self._pending_ops[future_id] = (self._OP_DELETE, task_id, len(keys), list(keys))
            self._pending_delete_events[task_id] = done_event
        if not done_event.wait(timeout=30.0):
            with self._lock:
                self._pending_delete_events.pop(task_id, None)
                for fid, entry in list(self._pending_ops.items()):
                    if entry[1] == task_id:
                        self._pending_ops.pop(fid, None)
                        break

    def get_usage(self):
        return super().get_usage()

    def report_status(self):
        status = {"is_healthy": self._demux_thread.is_alive() and not self._stop.is_set(),
                  "type": self._type_name}
        status.update(self._extra_status)
        return status

    def close(self):
        self._stop.set()
        self._demux_thread.join(timeout=5)
        self._client.close()
        self._store_efd.close()
        self._lookup_efd.close()
        self._load_efd.close()

    def _get_next_task_id(self):
        task_id = self._next_task_id
        self._next_task_id += 1
        return task_id

    def _demux_loop(self):
        poller = select.poll()
        poller.register(self._client_fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(500):
                continue
            try:
                completions = self._client.drain_completions()
            except Exception:  # noqa: BLE001 -- LMCache logs it and polls on
                continue
            if not completions:
                continue
            stored, stored_sizes, accessed, deleted, deleted_sizes, events = \
                [], [], [], [], [], []
            with self._lock:
                for future_id, ok, error, result_bools in completions:
                    entry = self._pending_ops.pop(int(future_id), None)
                    if entry is None:
                        continue
                    op_type, task_id, num_keys, keys = entry
                    if op_type == self._OP_STORE:
                        info = self._pending_store_sizes.pop(int(future_id), None)
                        task_bytes = 0
                        if ok and info is not None:
                            for key, size in zip(info[0], info[1], strict=True):
                                first = key not in self._key_sizes
                                if first:
                                    self._key_sizes[key] = size
                                    task_bytes += size
                                stored.append(key)
                                stored_sizes.append(size if first else 0)
                        self._completed_stores[task_id] = L2StoreResult(ok, task_bytes)
                        self._store_efd.notify()
                    elif op_type == self._OP_LOOKUP:
                        bitmap = Bitmap(num_keys)
                        if ok and result_bools is not None:
                            for i, found in enumerate(result_bools):
                                if found:
                                    bitmap.set(i)
                                    self._locked_keys[keys[i]] += 1
                        self._completed_lookups[task_id] = bitmap
                        self._lookup_efd.notify()
                    elif op_type == self._OP_LOAD:
                        bitmap = Bitmap(num_keys)
                        if result_bools is not None:
                            for i, loaded in enumerate(result_bools):
                                if loaded:
                                    bitmap.set(i)
                                    accessed.append(keys[i])
                        elif ok:  # a connector without per-key results: all loaded
                            for i in range(num_keys):
                                bitmap.set(i)
                            accessed.extend(keys)
                        self._completed_loads[task_id] = bitmap
                        self._load_efd.notify()
                    elif op_type == self._OP_DELETE:
                        if result_bools is not None:
                            for i, gone in enumerate(result_bools):
                                if gone and keys[i] in self._key_sizes:
                                    deleted_sizes.append(self._key_sizes.pop(keys[i]))
                                    deleted.append(keys[i])
                        evt = self._pending_delete_events.pop(task_id, None)
                        if evt is not None:
                            events.append(evt)
            if stored:
                self._notify_keys_stored(stored, stored_sizes)
            if accessed:
                self._notify_keys_accessed(accessed)
            if deleted:
                self._notify_keys_deleted(deleted, deleted_sizes)
            for evt in events:
                evt.set()


register_l2_adapter_type("native_plugin", NativePluginL2AdapterConfig)
register_l2_adapter_factory("native_plugin", _create_native_plugin_l2_adapter)


def make_adapter_from_cli(json_spec):
    """What LMCache's multiprocess server does with one --l2-adapter: parse the
    argument, then build the adapter through the factory registry."""
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    args = parser.parse_args(["--l2-adapter", json_spec])
    config = parse_args_to_l2_adapters_config(args).adapters[0]
    return create_l2_adapter_from_registry(config)
