// _kvengine: the pybind11 binding of kvengine::DB.
//
// This file is the C++ half of the Python package `kvengine` (python/kvengine/ is the
// other half).  It sits on the public API (include/kvengine/) only.
//
// Conventions (docs/python.md is the user's version):
//   * Calls named after Mooncake Store's Python API return integers: 0 or a count on
//     success, a negative kvengine error code (status.h) per failure.
//   * Problems with the *arguments themselves* -- a wrong type, a null pointer with a
//     non-zero size, a negative size, lists of different lengths, a non-contiguous buffer,
//     a read-only destination -- raise TypeError or ValueError before the engine is
//     called, so nothing changes.
//   * The GIL is released around every engine call.  Everything the engine reads from
//     Python (keys, buffer views) is copied or pinned while the GIL is held, and pinned
//     buffers are released only after the GIL is taken back.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cluster/rendezvous.h"
#include "kvengine/db.h"
#include "kvengine/options.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "python/src/lmcache_plugin.h"
#include "python/src/load_planner_binding.h"
#include "util/perf_point.h"
#include "util/printable.h"

namespace py = pybind11;

namespace kvengine {
namespace python {
namespace {

// Raised (as kvengine.Error, a RuntimeError with .code and .code_name) by the calls that
// report engine failures as exceptions rather than integers.
struct EngineError {
  int code;
  std::string code_name;
  std::string message;
};

EngineError ToError(const Status& s) {
  return EngineError{s.ErrorCode(), Status::CodeName(s.code()), s.ToString()};
}

// ---------------------------------------------------------------- argument parsing

// A key is str (encoded as UTF-8) or bytes-like (bytes, bytearray, memoryview).
std::string KeyFrom(py::handle h, const char* what) {
  if (PyUnicode_Check(h.ptr())) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
    if (s == nullptr) throw py::error_already_set();
    return std::string(s, static_cast<size_t>(n));
  }
  if (PyBytes_Check(h.ptr())) {
    return std::string(PyBytes_AS_STRING(h.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(h.ptr())));
  }
  if (PyObject_CheckBuffer(h.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      throw py::value_error(std::string(what) + " must be a contiguous buffer");
    }
    std::string key(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
    return key;
  }
  throw py::type_error(std::string(what) + " must be str or bytes, not " +
                       std::string(py::str(py::type::handle_of(h).attr("__name__"))));
}

std::vector<std::string> KeysFrom(py::handle h) {
  if (PyUnicode_Check(h.ptr()) || PyBytes_Check(h.ptr())) {
    throw py::type_error("keys must be a list of keys, not a single key");
  }
  if (!PySequence_Check(h.ptr())) {
    throw py::type_error("keys must be a list of str or bytes");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(h);
  std::vector<std::string> keys;
  keys.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    keys.push_back(KeyFrom(seq[i], ("keys[" + std::to_string(i) + "]").c_str()));
  }
  return keys;
}

std::vector<Slice> SlicesOf(const std::vector<std::string>& keys) {
  std::vector<Slice> slices;
  slices.reserve(keys.size());
  for (const auto& k : keys) slices.emplace_back(k);
  return slices;
}

bool IsInt(py::handle h) { return PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()); }

// An integer argument that must be in [0, max].
uint64_t UnsignedFrom(py::handle h, const std::string& what) {
  if (!IsInt(h)) {
    throw py::type_error(what + " must be an int, not " +
                         std::string(py::str(py::type::handle_of(h).attr("__name__"))));
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(h.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error(what + " is out of range");
    }
    return u;
  }
  if (overflow < 0 || v < 0) throw py::value_error(what + " must not be negative");
  return static_cast<uint64_t>(v);
}

// Pins the Python objects whose memory the engine reads or writes during a call.  Must be
// destroyed with the GIL held (it is: it outlives the gil_scoped_release scopes).
class Pins {
 public:
  Pins() = default;
  Pins(const Pins&) = delete;
  Pins& operator=(const Pins&) = delete;
  ~Pins() {
    for (auto& v : views_) PyBuffer_Release(&v);
  }
  Py_buffer* NewView() { return &views_.emplace_back(); }
  void DropLastView() { views_.pop_back(); }
  void Hold(py::object o) { objects_.push_back(std::move(o)); }

 private:
  std::vector<Py_buffer> views_;  // filled by PyObject_GetBuffer
  std::vector<py::object> objects_;
};

struct Region {
  uintptr_t addr = 0;
  uint64_t size = 0;
};

// Whether this build reaches CUDA device memory: the engine's GPU staging path
// (docs/gpu.md) takes device pointers itself.
#ifdef KV_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

// A torch.Tensor (or anything with the same duck type: data_ptr, is_contiguous, device,
// numel, element_size).  CPU memory, or CUDA memory in a CUDA build: its data_ptr() then
// goes to the engine as it is, and the engine moves the bytes between the device and its
// arena (no copy through pageable host memory here).
bool LooksLikeTensor(py::handle h) {
  return py::hasattr(h, "data_ptr") && py::hasattr(h, "element_size") && py::hasattr(h, "numel") &&
         py::hasattr(h, "is_contiguous");
}

Region RegionOfTensor(py::handle t, const std::string& what) {
  if (!py::cast<bool>(t.attr("is_contiguous")())) {
    throw py::value_error(what + " must be a contiguous tensor");
  }
  if (py::hasattr(t, "device")) {
    std::string type = py::str(t.attr("device").attr("type"));
    if (type == "cuda" && !kCudaBuild) {
      throw py::value_error(what +
                            " is a tensor on device 'cuda', but this kvengine was built "
                            "without CUDA (rebuild with the CUDA Toolkit, or copy it to the CPU)");
    }
    if (type != "cpu" && type != "cuda") {
      throw py::value_error(what + " is a tensor on device '" + type +
                            "': kvengine reads and writes CPU memory, and CUDA memory in a CUDA "
                            "build; copy it to the CPU");
    }
  }
  Region r;
  r.addr = static_cast<uintptr_t>(py::cast<uint64_t>(t.attr("data_ptr")()));
  r.size = py::cast<uint64_t>(t.attr("numel")()) * py::cast<uint64_t>(t.attr("element_size")());
  if (r.addr == 0 && r.size != 0) throw py::value_error(what + " has no storage");
  return r;
}

// A buffer-protocol object or a tensor; pinned in *pins for the duration of the call.
Region RegionOfObject(py::handle h, bool writable, Pins* pins, const std::string& what) {
  if (PyObject_CheckBuffer(h.ptr())) {
    Py_buffer* view = pins->NewView();
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(h.ptr(), view, flags) != 0) {
      pins->DropLastView();
      // Tell read-only apart from non-contiguous for a clear message.
      PyErr_Clear();
      Py_buffer probe;
      bool readonly = false;
      if (PyObject_GetBuffer(h.ptr(), &probe, PyBUF_C_CONTIGUOUS) == 0) {
        readonly = probe.readonly != 0;
        PyBuffer_Release(&probe);
      } else {
        PyErr_Clear();
      }
      if (writable && readonly) {
        throw py::type_error(what + " is read-only (" +
                             std::string(py::str(py::type::handle_of(h).attr("__name__"))) +
                             "); a destination must be writable (bytearray, numpy array ...)");
      }
      throw py::value_error(what + " must be a C-contiguous buffer");
    }
    return Region{reinterpret_cast<uintptr_t>(view->buf), static_cast<uint64_t>(view->len)};
  }
  if (LooksLikeTensor(h)) {
    Region r = RegionOfTensor(h, what);
    pins->Hold(py::reinterpret_borrow<py::object>(h));
    return r;
  }
  throw py::type_error(what +
                       " must be a buffer (bytes, bytearray, memoryview, numpy array) or a "
                       "torch tensor, not " +
                       std::string(py::str(py::type::handle_of(h).attr("__name__"))));
}

// A raw (pointer, size) pair from Python ints.
Region RegionOfPointer(py::handle ptr, py::handle size, const std::string& what) {
  Region r;
  r.addr = static_cast<uintptr_t>(UnsignedFrom(ptr, what + " pointer"));
  r.size = UnsignedFrom(size, what + " size");
  if (r.addr == 0 && r.size != 0) {
    throw py::value_error(what + " pointer is null with a size of " + std::to_string(r.size));
  }
  if (r.addr > std::numeric_limits<uintptr_t>::max() - r.size) {
    throw py::value_error(what + " pointer + size overflows the address space");
  }
  return r;
}

// One region per element: with sizes None every element is a buffer or tensor, else every
// element is an int pointer with the matching size.
std::vector<Region> RegionsFrom(py::handle items, py::handle sizes, bool writable, Pins* pins,
                                const std::string& what) {
  if (!PyList_Check(items.ptr()) && !PyTuple_Check(items.ptr())) {
    throw py::type_error(what + " must be a list");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(items);
  std::vector<Region> regions;
  regions.reserve(seq.size());
  if (sizes.is_none()) {
    for (size_t i = 0; i < seq.size(); ++i) {
      std::string name = what + "[" + std::to_string(i) + "]";
      if (IsInt(seq[i])) {
        throw py::type_error(name + " is an int pointer but no sizes were given");
      }
      regions.push_back(RegionOfObject(seq[i], writable, pins, name));
    }
    return regions;
  }
  if (!PyList_Check(sizes.ptr()) && !PyTuple_Check(sizes.ptr())) {
    throw py::type_error("sizes for " + what + " must be a list");
  }
  py::sequence sz = py::reinterpret_borrow<py::sequence>(sizes);
  if (sz.size() != seq.size()) {
    throw py::value_error(what + " has " + std::to_string(seq.size()) + " entries but its sizes " +
                          std::to_string(sz.size()));
  }
  for (size_t i = 0; i < seq.size(); ++i) {
    regions.push_back(RegionOfPointer(seq[i], sz[i], what + "[" + std::to_string(i) + "]"));
  }
  return regions;
}

void CheckSameLength(size_t keys, py::handle other, const char* name) {
  if (!PyList_Check(other.ptr()) && !PyTuple_Check(other.ptr())) {
    throw py::type_error(std::string(name) + " must be a list");
  }
  size_t n = static_cast<size_t>(PySequence_Size(other.ptr()));
  if (n != keys) {
    throw py::value_error(std::string(name) + " has " + std::to_string(n) + " entries for " +
                          std::to_string(keys) + " keys");
  }
}

// Per-key results of a batch call: the engine's, or the batch status's code for every key
// when the batch as a whole was refused (closed DB, too many keys, duplicate put keys).
std::vector<int64_t> Results(const Status& s, std::vector<int64_t> results, size_t n) {
  if (!s.ok() || results.size() != n) {
    int code = s.ok() ? Status::InvalidArgument("").ErrorCode() : s.ErrorCode();
    return std::vector<int64_t>(n, code);
  }
  return results;
}

// The bool syntax of options.h: 1/0, true/false, yes/no, on/off, any case.
bool ParseBool(const std::string& name, const std::string& value) {
  std::string v;
  for (char c : value) v.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw py::value_error("option " + name + "='" + value + "': expected a bool");
}

const int kNotOpen = -static_cast<int>(Status::Code::kAborted);

// ---------------------------------------------------------------- the store

class Store {
 public:
  Store() = default;
  ~Store() {
    std::shared_ptr<DB> db;
    {
      std::lock_guard<std::mutex> l(mu_);
      db = std::move(db_);
    }
    if (db) {
      std::vector<uintptr_t> buffers = HandleBuffers();
      py::gil_scoped_release nogil;
      UnregisterAll(db.get(), buffers);
      db->Close();
    }
  }

  // Opens the DB; raises ValueError for a bad option or an empty path, kvengine.Error for
  // an engine failure.
  void Open(const std::string& path, const std::map<std::string, std::string>& opts) {
    Connect(path, opts, DB::Open);
  }

  // Attaches to the DB an owner process serves on the Unix socket `socket_path`
  // (DB::Attach); errors as Open's.
  void Attach(const std::string& socket_path, const std::map<std::string, std::string>& opts) {
    Connect(socket_path, opts, DB::Attach);
  }

  int Close() {
    std::shared_ptr<DB> db = GetDb();
    if (!db) return 0;
    // A namespace's handle closes only itself while the DB lives on: the buffers it
    // registered (whole-DB registrations) are unregistered before their pins go.
    std::vector<uintptr_t> buffers = HandleBuffers();
    Status s;
    {
      py::gil_scoped_release nogil;
      UnregisterAll(db.get(), buffers);
      s = db->Close();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (db_ == db) db_.reset();  // callers still in flight hold their own reference
    }
    registered_.clear();
    return s.ErrorCode();
  }

  bool IsOpen() { return GetDb() != nullptr; }
  // The namespace's name for a namespace's handle; None for a DB.
  py::object Namespace() {
    return namespace_.empty() ? py::none() : py::object(py::str(namespace_));
  }
  // The DB, for the LMCache plug-in (lmcache_plugin.cc); nullptr when closed.
  std::shared_ptr<DB> SharedDb() { return GetDb(); }
  std::string Path() { return path_; }

  // ------------------------------------------------------------ buffers
  int RegisterBuffer(py::handle ptr_or_obj, py::handle size) {
    Region r;
    auto pins = std::make_unique<Pins>();
    if (size.is_none()) {
      if (IsInt(ptr_or_obj)) throw py::type_error("register_buffer(ptr) needs a size");
      r = RegionOfObject(ptr_or_obj, /*writable=*/false, pins.get(), "buffer");
    } else {
      r = RegionOfPointer(ptr_or_obj, size, "buffer");
    }
    if (r.addr == 0 || r.size == 0) throw py::value_error("buffer is empty");
    auto db = GetDb();
    if (!db) return kNotOpen;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->RegisterBuffer(reinterpret_cast<void*>(r.addr), r.size);
    }
    if (s.ok()) registered_[r.addr] = std::move(pins);
    return s.ErrorCode();
  }

  int UnregisterBuffer(py::handle ptr_or_obj) {
    uintptr_t addr;
    if (IsInt(ptr_or_obj)) {
      addr = static_cast<uintptr_t>(UnsignedFrom(ptr_or_obj, "buffer pointer"));
    } else {
      Pins tmp;
      addr = RegionOfObject(ptr_or_obj, false, &tmp, "buffer").addr;
    }
    auto db = GetDb();
    if (!db) return kNotOpen;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->UnregisterBuffer(reinterpret_cast<void*>(addr));
    }
    if (s.ok()) registered_.erase(addr);
    return s.ErrorCode();
  }

  // ------------------------------------------------------------ single keys
  int Put(py::handle key_obj, py::handle value) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_put);
    std::string key = KeyFrom(key_obj, "key");
    Pins pins;
    Region r = RegionOfObject(value, false, &pins, "value");
    return PutRegion(key, r);
  }

  int PutFrom(py::handle key_obj, py::handle ptr_or_obj, py::handle size) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_put);
    std::string key = KeyFrom(key_obj, "key");
    Pins pins;
    Region r = size.is_none() ? RegionOfObject(ptr_or_obj, false, &pins, "buffer")
                              : RegionOfPointer(ptr_or_obj, size, "buffer");
    return PutRegion(key, r);
  }

  // The value as bytes; b"" when absent or on error (Mooncake's convention).  With
  // raise_missing, raises KeyError when absent and kvengine.Error on other failures.
  py::bytes Get(py::handle key_obj, bool raise_missing) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_get);
    std::string key = KeyFrom(key_obj, "key");
    auto db = GetDb();
    if (!db) {
      if (raise_missing) throw ToError(Status::Aborted("the store is not open"));
      return py::bytes("");
    }
    // Size, allocate the bytes object, read straight into it: one copy.  Retried when the
    // value is replaced by a larger one in between.
    for (int attempt = 0;; ++attempt) {
      uint64_t size = 0;
      Status s;
      {
        py::gil_scoped_release nogil;
        s = db->GetValueSize(key, &size);
      }
      if (s.ok()) {
        py::object out = py::reinterpret_steal<py::object>(
            PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
        if (!out) throw py::error_already_set();
        char* buf = PyBytes_AS_STRING(out.ptr());
        size_t got = 0;
        {
          py::gil_scoped_release nogil;
          s = db->GetInto(ReadOptions(), key, MutableSlice(buf, size), &got);
        }
        if (s.ok()) {
          if (got == size) return py::reinterpret_steal<py::bytes>(out.release());
          return py::bytes(buf, got);  // replaced by a smaller value meanwhile
        }
        if (s.IsBufferTooSmall() && attempt < 8) continue;
      }
      if (!raise_missing) return py::bytes("");
      if (s.IsNotFound()) throw py::key_error(key);
      throw ToError(s);
    }
  }

  int64_t GetInto(py::handle key_obj, py::handle ptr_or_obj, py::handle size) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_get);
    std::string key = KeyFrom(key_obj, "key");
    Pins pins;
    Region r = size.is_none() ? RegionOfObject(ptr_or_obj, true, &pins, "buffer")
                              : RegionOfPointer(ptr_or_obj, size, "buffer");
    auto db = GetDb();
    if (!db) return kNotOpen;
    Status s;
    size_t got = 0;
    {
      py::gil_scoped_release nogil;
      s = db->GetInto(ReadOptions(), key, MutableSlice(reinterpret_cast<void*>(r.addr), r.size),
                      &got);
    }
    return s.ok() ? static_cast<int64_t>(got) : s.ErrorCode();
  }

  int64_t GetSize(py::handle key_obj) {
    std::string key = KeyFrom(key_obj, "key");
    return Count([&](DB* db, uint64_t* size) { return db->GetValueSize(key, size); });
  }

  int64_t IsExist(py::handle key_obj) {
    std::vector<std::string> keys{KeyFrom(key_obj, "key")};
    return Exists(keys)[0];
  }

  // DB::Prefetch: per key 1 when its read up from SSD started, 0 when not, else negative.
  std::vector<int64_t> BatchPrefetch(py::handle keys_obj) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_prefetch);
    return AskKeys(KeysFrom(keys_obj), &DB::Prefetch);
  }

  std::vector<int64_t> BatchIsExist(py::handle keys_obj) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_exists);
    return Exists(KeysFrom(keys_obj));
  }

  // The number of keys, from the first, that are present (the run of 1s at the start of
  // BatchExists' results): SGLang's batch_exists and vLLM-style prefix lookups in one call
  // with no per-key Python.  When the first key that is not present failed instead (a
  // closed store, an owner gone), that key's negative code is returned, so a caller can
  // tell "nothing stored" (0) from "could not ask" (< 0).
  int64_t LeadingExist(py::handle keys_obj) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_exists);
    int64_t leading = 0;
    for (int64_t r : Exists(KeysFrom(keys_obj))) {
      if (r != 1) return (r < 0 && leading == 0) ? r : leading;
      ++leading;
    }
    return leading;
  }

  // BatchLocate: per key 0 absent, 1 memory, 2 SSD, 3 a peer, or a negative code.
  std::vector<int64_t> BatchLocate(py::handle keys_obj) {
    return AskKeys(KeysFrom(keys_obj), &DB::BatchLocate);
  }

  // ReadRemovals: (events, missed, last_sequence), each event a tuple (sequence,
  // time_micros, tier, reason, key bytes) with tier "memory" | "ssd" and reason
  // "capacity" | "deleted"; or a negative code.
  py::object ReadRemovals(uint64_t after, int64_t max_events) {
    if (max_events < 0) throw py::value_error("max_events must not be negative");
    auto db = GetDb();
    if (!db) return py::int_(kNotOpen);
    RemovalBatch batch;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->ReadRemovals(after, static_cast<size_t>(max_events), &batch);
    }
    if (!s.ok()) return py::int_(s.ErrorCode());
    py::list events;
    for (const RemovalEvent& e : batch.events) {
      events.append(py::make_tuple(
          e.sequence, e.time_micros, e.tier == RemovalEvent::kMemory ? "memory" : "ssd",
          e.reason == RemovalEvent::kCapacity ? "capacity" : "deleted", py::bytes(e.key)));
    }
    return py::make_tuple(events, batch.missed, batch.last_sequence);
  }

  // ReadResident: calls fn(list of (tier, key bytes)), tier "memory" | "ssd", per batch
  // of at most max_batch keys starting with prefix; fn returning False stops.  Returns
  // (epoch, removal_sequence, keys reported), or a negative code.  The batches are
  // gathered without the GIL and handed to fn with it.
  py::object ReadResident(py::function fn, py::bytes prefix, int64_t max_batch) {
    if (max_batch <= 0) throw py::value_error("max_batch must be positive");
    auto db = GetDb();
    if (!db) return py::int_(kNotOpen);
    const std::string want = prefix;
    ResidentSnapshot snapshot;
    Status s;
    std::exception_ptr failed;
    {
      py::gil_scoped_release nogil;
      s = db->ReadResident(
          want, static_cast<size_t>(max_batch),
          [&](std::span<const ResidentKey> keys) {
            py::gil_scoped_acquire gil;
            try {
              py::list batch;
              for (const ResidentKey& k : keys) {
                batch.append(
                    py::make_tuple(k.tier == kLocatedSsd ? "ssd" : "memory", py::bytes(k.key)));
              }
              py::object more = fn(batch);
              return more.is_none() || more.cast<bool>();
            } catch (...) {
              failed = std::current_exception();
              return false;
            }
          },
          &snapshot);
    }
    if (failed) std::rethrow_exception(failed);
    if (!s.ok()) return py::int_(s.ErrorCode());
    return py::make_tuple(snapshot.epoch, snapshot.removal_sequence, snapshot.keys);
  }

  int Remove(py::handle key_obj) {
    std::string key = KeyFrom(key_obj, "key");
    auto db = GetDb();
    if (!db) return kNotOpen;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->Delete(WriteOptions(), key);
    }
    return s.ErrorCode();
  }

  std::vector<int64_t> BatchRemove(py::handle keys_obj) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_delete);
    std::vector<std::string> keys = KeysFrom(keys_obj);
    auto db = GetDb();
    if (!db) return std::vector<int64_t>(keys.size(), kNotOpen);
    std::vector<Slice> slices = SlicesOf(keys);
    std::vector<int64_t> results;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->BatchDelete(WriteOptions(), slices, &results);
    }
    return Results(s, std::move(results), keys.size());
  }

  int64_t RemoveByRegex(const std::string& pattern) {
    return Count([&](DB* db, uint64_t* n) { return db->DeleteByRegex(pattern, n); });
  }

  int64_t RemoveAll() {
    return Count([](DB* db, uint64_t* n) { return db->DeleteAll(n); });
  }

  int Flush() {
    auto db = GetDb();
    if (!db) return kNotOpen;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->Flush();
    }
    return s.ErrorCode();
  }

  // The property's text, or None for an unknown name or a closed store.
  py::object Property(const std::string& name) {
    auto db = GetDb();
    if (!db) return py::none();
    std::string value;
    bool found;
    {
      py::gil_scoped_release nogil;
      found = db->GetProperty(name, &value);
    }
    if (!found) return py::none();
    return py::str(value);
  }

  // ------------------------------------------------------------ namespaces
  // Creates namespace `name` and makes `into` (a store not open) its handle.  Raises
  // ValueError for a negative quota or a weight out of range of uint32, kvengine.Error for
  // the engine's refusal (a bad name or weight, a name that exists, a closed store, an
  // attached store: NotSupported).
  void CreateNamespace(Store& into, py::handle name_obj, py::handle memory_quota,
                       py::handle ssd_quota, py::handle weight) {
    std::string name = NameFrom(name_obj);
    NamespaceOptions options;
    options.memory_quota_bytes = UnsignedFrom(memory_quota, "memory_quota_bytes");
    options.ssd_quota_bytes = UnsignedFrom(ssd_quota, "ssd_quota_bytes");
    uint64_t w = UnsignedFrom(weight, "weight");
    if (w > std::numeric_limits<uint32_t>::max()) throw py::value_error("weight is out of range");
    options.weight = static_cast<uint32_t>(w);
    BindNamespace(into, name, [&](DB* db, std::unique_ptr<DB>* handle) {
      return db->CreateNamespace(name, options, handle);
    });
  }

  // Makes `into` a handle of the existing namespace `name`; kvengine.Error (NotFound ...)
  // otherwise.
  void OpenNamespace(Store& into, py::handle name_obj) {
    std::string name = NameFrom(name_obj);
    BindNamespace(into, name, [&](DB* db, std::unique_ptr<DB>* handle) {
      return db->OpenNamespace(name, handle);
    });
  }

  // The number of keys removed with the namespace, or a negative code.
  int64_t DropNamespace(py::handle name_obj) {
    std::string name = NameFrom(name_obj);
    return Count([&](DB* db, uint64_t* n) { return db->DropNamespace(name, n); });
  }

  // One dict per registered namespace (name, id, memory_quota_bytes, ssd_quota_bytes,
  // weight, dropping); kvengine.Error when the store cannot list them.
  py::list ListNamespaces() {
    auto db = GetDb();
    if (!db) throw ToError(Status::Aborted("the store is not open"));
    std::vector<NamespaceInfo> infos;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->ListNamespaces(&infos);
    }
    if (!s.ok()) throw ToError(s);
    py::list out;
    for (const NamespaceInfo& info : infos) {
      py::dict d;
      d["name"] = info.name;
      d["id"] = info.id;
      d["memory_quota_bytes"] = info.options.memory_quota_bytes;
      d["ssd_quota_bytes"] = info.options.ssd_quota_bytes;
      d["weight"] = info.options.weight;
      d["dropping"] = info.dropping;
      out.append(d);
    }
    return out;
  }

  // ------------------------------------------------------------ batches
  // values[i]: one buffer per key (sizes None) or one pointer per key with sizes[i].
  std::vector<int64_t> BatchPutFrom(py::handle keys_obj, py::handle items, py::handle sizes) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_put);
    std::vector<std::string> keys = KeysFrom(keys_obj);
    CheckSameLength(keys.size(), items, "buffers");
    if (!sizes.is_none()) CheckSameLength(keys.size(), sizes, "sizes");
    Pins pins;
    std::vector<Region> regions = RegionsFrom(items, sizes, false, &pins, "buffers");
    std::vector<ValueParts> values(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      values[i].emplace_back(reinterpret_cast<const void*>(regions[i].addr), regions[i].size);
    }
    return DoBatchPut(keys, values);
  }

  std::vector<int64_t> BatchGetInto(py::handle keys_obj, py::handle items, py::handle sizes) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_get_into);
    std::vector<std::string> keys = KeysFrom(keys_obj);
    CheckSameLength(keys.size(), items, "buffers");
    if (!sizes.is_none()) CheckSameLength(keys.size(), sizes, "sizes");
    Pins pins;
    std::vector<Region> regions = RegionsFrom(items, sizes, true, &pins, "buffers");
    std::vector<Destination> dests(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      dests[i].emplace_back(reinterpret_cast<void*>(regions[i].addr), regions[i].size);
    }
    return DoBatchGet(keys, dests);
  }

  // items[i]: the list of buffers (or pointers, with sizes[i]) whose concatenation is
  // keys[i]'s value.
  std::vector<int64_t> BatchPutFromMulti(py::handle keys_obj, py::handle items, py::handle sizes) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_put);
    std::vector<std::string> keys = KeysFrom(keys_obj);
    Pins pins;
    std::vector<std::vector<Region>> regions =
        MultiRegions(keys.size(), items, sizes, false, &pins);
    std::vector<ValueParts> values(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      values[i].reserve(regions[i].size());
      for (const Region& r : regions[i]) {
        values[i].emplace_back(reinterpret_cast<const void*>(r.addr), r.size);
      }
    }
    return DoBatchPut(keys, values);
  }

  std::vector<int64_t> BatchGetIntoMulti(py::handle keys_obj, py::handle items, py::handle sizes) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_get_into);
    std::vector<std::string> keys = KeysFrom(keys_obj);
    Pins pins;
    std::vector<Destination> dests = MultiDestinations(keys.size(), items, sizes, &pins);
    return DoBatchGet(keys, dests);
  }

  // A layer-wise load (DB::BatchGetIntoGroups): keys and items as for
  // batch_get_into_multi_buffers, group g being the keys up to group_ends[g].  Every
  // group's reads may be in flight at once; on_ready(g, results of group g) is called with
  // the GIL, in group order, as soon as group g is in.  Returns every key's result.  An
  // exception raised by on_ready stops the reports and is raised once the load is over.
  std::vector<int64_t> BatchGetIntoGroups(py::handle keys_obj, py::handle items, py::handle sizes,
                                          const std::vector<size_t>& group_ends,
                                          py::object on_ready) {
    kvengine::PerfPoint perf(kvengine::PerfKey::py_batch_get_into);
    std::vector<std::string> keys = KeysFrom(keys_obj);
    Pins pins;
    std::vector<Destination> dests = MultiDestinations(keys.size(), items, sizes, &pins);
    auto db = GetDb();
    if (!db) return std::vector<int64_t>(keys.size(), kNotOpen);
    std::vector<Slice> slices = SlicesOf(keys);
    std::vector<int64_t> results;
    std::unique_ptr<py::error_already_set> raised;  // on_ready's exception
    DB::GroupReadyFn ready;
    if (!on_ready.is_none()) {
      ready = [&](size_t g) {
        py::gil_scoped_acquire gil;
        if (raised != nullptr) return;
        py::list r;
        for (size_t i = g == 0 ? 0 : group_ends[g - 1]; i < group_ends[g]; ++i)
          r.append(results[i]);
        try {
          on_ready(g, r);
        } catch (py::error_already_set& e) {
          raised = std::make_unique<py::error_already_set>(std::move(e));
        }
      };
    }
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->BatchGetIntoGroups(ReadOptions(), slices, dests, group_ends, ready, &results);
    }
    if (raised != nullptr) throw std::move(*raised);
    return Results(s, std::move(results), keys.size());
  }

  // For the benchmark: runs the same multi-buffer batch `iterations` times from C++ with no
  // Python in the loop, and returns the seconds taken.  op is "put" or "get".
  double CppBatchLoop(const std::string& op, py::handle keys_obj, py::handle items,
                      py::handle sizes, int iterations) {
    if (op != "put" && op != "get") throw py::value_error("op must be 'put' or 'get'");
    if (iterations < 1) throw py::value_error("iterations must be at least 1");
    std::vector<std::string> keys = KeysFrom(keys_obj);
    Pins pins;
    bool get = op == "get";
    std::vector<std::vector<Region>> regions = MultiRegions(keys.size(), items, sizes, get, &pins);
    std::vector<ValueParts> values(keys.size());
    std::vector<Destination> dests(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      for (const Region& r : regions[i]) {
        values[i].emplace_back(reinterpret_cast<const void*>(r.addr), r.size);
        dests[i].emplace_back(reinterpret_cast<void*>(r.addr), r.size);
      }
    }
    auto db = GetDb();
    if (!db) throw ToError(Status::Aborted("the store is not open"));
    std::vector<Slice> slices = SlicesOf(keys);
    Status s;
    double seconds;
    {
      py::gil_scoped_release nogil;
      auto start = std::chrono::steady_clock::now();
      std::vector<int64_t> results;
      for (int it = 0; it < iterations && s.ok(); ++it) {
        results.clear();
        s = get ? db->BatchGetInto(ReadOptions(), slices, dests, &results)
                : db->BatchPut(WriteOptions(), slices, values, &results);
        for (int64_t r : results) {
          if (r < 0) s = Status::FromErrorCode(static_cast<int>(r), "a key of the batch failed");
        }
      }
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (!s.ok()) throw ToError(s);
    return seconds;
  }

 private:
  using Opener = Status (*)(const Options&, const std::string&, std::unique_ptr<DB>*);
  void Connect(const std::string& where, const std::map<std::string, std::string>& opts,
               Opener opener) {
    Options options;
    for (const auto& [name, value] : opts) {
      if (name == "apply_environment") {  // a field Options::Set leaves alone on purpose
        options.apply_environment = ParseBool(name, value);
        continue;
      }
      Status s = options.Set(name, value);
      if (!s.ok()) throw py::value_error(s.message());
    }
    if (GetDb() != nullptr) throw py::value_error("the store is already open; close() it first");
    if (where.empty()) throw py::value_error("path is empty");
    // Options are checked here, as DB::Open will check them, so that a bad one is the
    // caller's ValueError; whatever the opener reports after that is an engine outcome
    // (kvengine.Error, or setup()'s code), such as a path that is a file.
    Options effective = options;
    Status s = effective.apply_environment ? effective.ApplyEnvironment() : Status::OK();
    if (s.ok()) s = effective.Validate();
    if (!s.ok()) throw py::value_error(s.message());
    std::unique_ptr<DB> db;
    {
      py::gil_scoped_release nogil;
      s = opener(options, where, &db);
    }
    if (!s.ok()) throw ToError(s);
    std::lock_guard<std::mutex> l(mu_);
    db_ = std::shared_ptr<DB>(std::move(db));
    path_ = where;
  }

  std::shared_ptr<DB> GetDb() {
    std::lock_guard<std::mutex> l(mu_);
    return db_;
  }

  // A call of the DB that reports a count, fn(db, &count), without the GIL: the count, or
  // the negative code.
  template <class Fn>
  int64_t Count(Fn fn) {
    auto db = GetDb();
    if (!db) return kNotOpen;
    uint64_t n = 0;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = fn(db.get(), &n);
    }
    return s.ok() ? static_cast<int64_t>(n) : s.ErrorCode();
  }

  static std::string NameFrom(py::handle h) {
    if (!PyUnicode_Check(h.ptr())) {
      throw py::type_error("a namespace name must be str, not " +
                           std::string(py::str(py::type::handle_of(h).attr("__name__"))));
    }
    return py::cast<std::string>(h);
  }

  // Runs make(db, &handle) without the GIL and makes `into` that handle.
  template <class Make>
  void BindNamespace(Store& into, const std::string& name, Make make) {
    if (&into == this || into.GetDb() != nullptr) {
      throw py::value_error("a namespace's handle must be a new, unopened store");
    }
    auto db = GetDb();
    if (!db) throw ToError(Status::Aborted("the store is not open"));
    std::unique_ptr<DB> handle;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = make(db.get(), &handle);
    }
    if (!s.ok()) throw ToError(s);
    std::lock_guard<std::mutex> l(into.mu_);
    into.db_ = std::shared_ptr<DB>(std::move(handle));
    into.path_ = path_;
    into.namespace_ = name;
  }

  // The buffers a namespace's handle registered (none for a DB, whose Close ends every
  // registration).  With the GIL held.
  std::vector<uintptr_t> HandleBuffers() const {
    std::vector<uintptr_t> out;
    if (!namespace_.empty()) {
      for (const auto& entry : registered_) out.push_back(entry.first);
    }
    return out;
  }

  static void UnregisterAll(DB* db, const std::vector<uintptr_t>& buffers) {
    for (uintptr_t addr : buffers) db->UnregisterBuffer(reinterpret_cast<void*>(addr));
  }

  int PutRegion(const std::string& key, Region r) {
    auto db = GetDb();
    if (!db) return kNotOpen;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->Put(WriteOptions(), key, Slice(reinterpret_cast<const void*>(r.addr), r.size));
    }
    return s.ErrorCode();
  }

  std::vector<int64_t> Exists(const std::vector<std::string>& keys) {
    return AskKeys(keys, &DB::BatchExists);
  }

  // A batch call of the DB that takes only keys (BatchExists, BatchLocate, Prefetch),
  // without the GIL: its results per key.
  std::vector<int64_t> AskKeys(const std::vector<std::string>& keys,
                               Status (DB::*ask)(std::span<const Slice>, std::vector<int64_t>*)) {
    auto db = GetDb();
    if (!db) return std::vector<int64_t>(keys.size(), kNotOpen);
    std::vector<Slice> slices = SlicesOf(keys);
    std::vector<int64_t> results;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = (db.get()->*ask)(slices, &results);
    }
    return Results(s, std::move(results), keys.size());
  }

  std::vector<std::vector<Region>> MultiRegions(size_t n, py::handle items, py::handle sizes,
                                                bool writable, Pins* pins) {
    CheckSameLength(n, items, "buffers");
    if (!sizes.is_none()) CheckSameLength(n, sizes, "sizes");
    py::sequence seq = py::reinterpret_borrow<py::sequence>(items);
    std::vector<std::vector<Region>> regions(n);
    for (size_t i = 0; i < n; ++i) {
      std::string name = "buffers[" + std::to_string(i) + "]";
      py::handle sz = sizes.is_none() ? py::handle(Py_None)
                                      : py::handle(py::reinterpret_borrow<py::sequence>(sizes)[i]);
      regions[i] = RegionsFrom(seq[i], sz, writable, pins, name);
    }
    return regions;
  }

  // MultiRegions for a read: each key's buffers as its Destination.
  std::vector<Destination> MultiDestinations(size_t n, py::handle items, py::handle sizes,
                                             Pins* pins) {
    std::vector<std::vector<Region>> regions = MultiRegions(n, items, sizes, true, pins);
    std::vector<Destination> dests(n);
    for (size_t i = 0; i < n; ++i) {
      dests[i].reserve(regions[i].size());
      for (const Region& r : regions[i]) {
        dests[i].emplace_back(reinterpret_cast<void*>(r.addr), r.size);
      }
    }
    return dests;
  }

  std::vector<int64_t> DoBatchPut(const std::vector<std::string>& keys,
                                  const std::vector<ValueParts>& values) {
    auto db = GetDb();
    if (!db) return std::vector<int64_t>(keys.size(), kNotOpen);
    std::vector<Slice> slices = SlicesOf(keys);
    std::vector<int64_t> results;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->BatchPut(WriteOptions(), slices, values, &results);
    }
    return Results(s, std::move(results), keys.size());
  }

  std::vector<int64_t> DoBatchGet(const std::vector<std::string>& keys,
                                  const std::vector<Destination>& dests) {
    auto db = GetDb();
    if (!db) return std::vector<int64_t>(keys.size(), kNotOpen);
    std::vector<Slice> slices = SlicesOf(keys);
    std::vector<int64_t> results;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = db->BatchGetInto(ReadOptions(), slices, dests, &results);
    }
    return Results(s, std::move(results), keys.size());
  }

  std::mutex mu_;  // guards db_ (calls copy it, then run without the lock or the GIL)
  std::shared_ptr<DB> db_;
  std::string path_;
  std::string namespace_;  // set once, before the handle is shared: its namespace's name
  // Buffers registered through register_buffer(obj): pinned until unregistered or closed.
  // Touched with the GIL held only.
  std::map<uintptr_t, std::unique_ptr<Pins>> registered_;
};

}  // namespace
}  // namespace python
}  // namespace kvengine

using kvengine::Options;
using kvengine::Status;
using kvengine::python::EngineError;
using kvengine::python::Store;

PYBIND11_MODULE(_kvengine, m) {
  m.doc() = "kvengine: the C++ binding (use the kvengine package, not this module)";

  static py::object error_type = py::reinterpret_borrow<py::object>(
      py::handle(PyErr_NewException("kvengine._kvengine.Error", PyExc_RuntimeError, nullptr)));
  m.attr("Error") = error_type;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const EngineError& e) {
      py::object exc = error_type(e.message);
      exc.attr("code") = e.code;
      exc.attr("code_name") = e.code_name;
      PyErr_SetObject(error_type.ptr(), exc.ptr());
    }
  });

  py::dict codes;
  for (int c = 0; c <= static_cast<int>(Status::kLastCode); ++c) {
    codes[py::int_(-c)] = Status::CodeName(static_cast<Status::Code>(c));
  }
  m.attr("ERROR_CODES") = codes;

  py::list names;
  for (const auto& n : Options::SettableNames()) names.append(n);
  m.attr("OPTION_NAMES") = names;
  m.def(
      "printable_key",
      [](py::bytes key) {
        const std::string_view bytes(key);
        return kvengine::Printable(kvengine::Slice(bytes.data(), bytes.size()));
      },
      py::arg("key"),
      "key (bytes) as kvengine's messages and logs show it: quoted, at most 64 bytes "
      "escaped, and for a longer key its length and hash");
  m.def(
      "rendezvous_owners",
      [](py::bytes key, const std::vector<std::string>& members, size_t replicas) {
        const std::string_view bytes(key);
        return kvengine::TopOwners(kvengine::Slice(bytes.data(), bytes.size()), members, replicas);
      },
      py::arg("key"), py::arg("members"), py::arg("replicas"),
      "the first `replicas` of `members` (endpoints as host:port) in key's rendezvous "
      "order, best first: the members a sharded cluster puts key on");
  m.attr("CUDA_BUILD") = kvengine::python::kCudaBuild;

  py::class_<Store>(m, "Store")
      .def(py::init<>())
      .def("_open", &Store::Open, py::arg("path"), py::arg("options"))
      .def("_attach", &Store::Attach, py::arg("socket_path"), py::arg("options"))
      .def("close", &Store::Close, "Closes the store. Returns 0 or a negative error code.")
      .def_property_readonly("is_open", &Store::IsOpen)
      .def_property_readonly("path", &Store::Path)
      .def("register_buffer", &Store::RegisterBuffer, py::arg("ptr"), py::arg("size") = py::none())
      .def("unregister_buffer", &Store::UnregisterBuffer, py::arg("ptr"))
      .def("put", &Store::Put, py::arg("key"), py::arg("value"))
      .def(
          "get", [](Store& s, py::handle key) { return s.Get(key, false); }, py::arg("key"))
      .def(
          "_get_or_raise", [](Store& s, py::handle key) { return s.Get(key, true); },
          py::arg("key"))
      .def("put_from", &Store::PutFrom, py::arg("key"), py::arg("ptr"),
           py::arg("size") = py::none())
      .def("get_into", &Store::GetInto, py::arg("key"), py::arg("ptr"),
           py::arg("size") = py::none())
      .def("batch_put_from", &Store::BatchPutFrom, py::arg("keys"), py::arg("ptrs"),
           py::arg("sizes") = py::none())
      .def("batch_get_into", &Store::BatchGetInto, py::arg("keys"), py::arg("ptrs"),
           py::arg("sizes") = py::none())
      .def("batch_put_from_multi_buffers", &Store::BatchPutFromMulti, py::arg("keys"),
           py::arg("ptrs"), py::arg("sizes") = py::none())
      .def("batch_get_into_multi_buffers", &Store::BatchGetIntoMulti, py::arg("keys"),
           py::arg("ptrs"), py::arg("sizes") = py::none())
      .def("batch_get_into_groups", &Store::BatchGetIntoGroups, py::arg("keys"), py::arg("ptrs"),
           py::arg("sizes"), py::arg("group_ends"), py::arg("on_ready") = py::none(),
           "A layer-wise load: batch_get_into_multi_buffers of keys in groups (group g ends "
           "at group_ends[g]); every group's reads may be in flight at once, and "
           "on_ready(g, results) is called, in group order, as soon as group g is in.")
      .def("is_exist", &Store::IsExist, py::arg("key"))
      .def("batch_is_exist", &Store::BatchIsExist, py::arg("keys"))
      .def("batch_prefetch", &Store::BatchPrefetch, py::arg("keys"),
           "Starts reading the keys' SSD-resident values up into memory for a read soon; "
           "per key 1 (started), 0 (not needed or not possible), or a negative error.")
      .def("batch_leading_exist", &Store::LeadingExist, py::arg("keys"))
      .def("batch_locate", &Store::BatchLocate, py::arg("keys"))
      .def("read_removals", &Store::ReadRemovals, py::arg("after") = 0,
           py::arg("max_events") = 1024)
      .def("read_resident", &Store::ReadResident, py::arg("fn"), py::arg("prefix") = py::bytes(),
           py::arg("max_batch") = 1024,
           "Snapshot of the resident set: fn(list of (tier, key)) per batch; returns "
           "(epoch, removal_sequence, keys), or a negative code (docs/observability.md).")
      .def("remove", &Store::Remove, py::arg("key"))
      .def("batch_remove", &Store::BatchRemove, py::arg("keys"))
      .def("remove_by_regex", &Store::RemoveByRegex, py::arg("pattern"))
      .def("remove_all", &Store::RemoveAll)
      .def("get_size", &Store::GetSize, py::arg("key"))
      .def("flush", &Store::Flush)
      .def("get_property", &Store::Property, py::arg("name"))
      .def_property_readonly("namespace_name", &Store::Namespace)
      .def("_create_namespace", &Store::CreateNamespace, py::arg("into"), py::arg("name"),
           py::arg("memory_quota_bytes"), py::arg("ssd_quota_bytes"), py::arg("weight"))
      .def("_open_namespace", &Store::OpenNamespace, py::arg("into"), py::arg("name"))
      .def("drop_namespace", &Store::DropNamespace, py::arg("name"),
           "Removes namespace name and every key of it. Returns the number of keys "
           "removed, or a negative error code.")
      .def("list_namespaces", &Store::ListNamespaces,
           "The registered namespaces, one dict each (the default namespace is not listed).")
      .def("_cpp_batch_loop", &Store::CppBatchLoop, py::arg("op"), py::arg("keys"), py::arg("ptrs"),
           py::arg("sizes"), py::arg("iterations"));
  kvengine::python::BindLoadPlanner(m);
  kvengine::python::BindLMCachePlugin(m,
                                      [](py::handle h) { return py::cast<Store&>(h).SharedDb(); });
}
