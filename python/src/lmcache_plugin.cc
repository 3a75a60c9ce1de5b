// _kvengine.LMCachePlugin: LMCache's native plug-in surface (event_fd, submit_batch_*,
// drain_completions, close) over LMCacheQueue.
//
// A submit reads its arguments with the GIL held -- the keys are copied, each memoryview
// is pinned (PyObject_GetBuffer) -- then queues the batch with the GIL released and
// returns its future id.  It never waits for the engine.  The pins travel with the batch
// and are released when its completion is drained (or when the plug-in is closed), with
// the GIL taken back.
#include "python/src/lmcache_plugin.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "python/src/lmcache_queue.h"

namespace py = pybind11;

namespace kvengine {
namespace python {
namespace {

using lmcache::BatchCompletion;
using lmcache::BatchOp;
using lmcache::BatchRequest;
using lmcache::LMCacheQueue;
using lmcache::QueueOptions;

// The Py_buffer views of one batch.  Released with the GIL, whichever thread drops the
// last reference (LMCacheQueue moves it into the completion, which Python drains).
class BatchPins {
 public:
  BatchPins() = default;
  BatchPins(const BatchPins&) = delete;
  BatchPins& operator=(const BatchPins&) = delete;
  ~BatchPins() {
    if (views_.empty() || !Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    for (Py_buffer& v : views_) PyBuffer_Release(&v);
    PyGILState_Release(gil);
  }
  void Reserve(size_t n) { views_.reserve(n); }
  // Pins obj's bytes; raises TypeError/ValueError naming `what` when it cannot.
  MutableSlice Pin(py::handle obj, bool writable, const std::string& what) {
    if (!PyObject_CheckBuffer(obj.ptr())) {
      throw py::type_error(what + " must be a memoryview (or another buffer), not " +
                           std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
    }
    Py_buffer view;
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
      PyErr_Clear();
      throw py::value_error(what + (writable ? " must be a writable C-contiguous buffer"
                                             : " must be a C-contiguous buffer"));
    }
    views_.push_back(view);
    return MutableSlice(view.buf, static_cast<size_t>(view.len));
  }

 private:
  std::vector<Py_buffer> views_;
};

std::vector<std::string> KeyList(py::handle keys, const char* call) {
  if (!PyList_Check(keys.ptr()) && !PyTuple_Check(keys.ptr())) {
    throw py::type_error(std::string(call) + ": keys must be a list of str");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(keys);
  std::vector<std::string> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    py::handle k = seq[i];
    Py_ssize_t n = 0;
    const char* s = nullptr;
    if (PyUnicode_Check(k.ptr())) {
      s = PyUnicode_AsUTF8AndSize(k.ptr(), &n);
      if (s == nullptr) throw py::error_already_set();
    } else if (PyBytes_Check(k.ptr())) {
      s = PyBytes_AS_STRING(k.ptr());
      n = PyBytes_GET_SIZE(k.ptr());
    } else {
      throw py::type_error(std::string(call) + ": keys[" + std::to_string(i) +
                           "] must be str, not " +
                           std::string(py::str(py::type::handle_of(k).attr("__name__"))));
    }
    out.emplace_back(s, static_cast<size_t>(n));
  }
  return out;
}

class Plugin {
 public:
  Plugin(StoreDbGetter db_of, py::handle store, int workers, bool register_buffers,
         uint64_t part_bytes)
      : db_of_(std::move(db_of)) {
    std::shared_ptr<DB> db = db_of_(store);
    if (!db) throw py::value_error("LMCachePlugin: the store is closed");
    QueueOptions options;
    options.workers = workers;
    options.register_buffers = register_buffers;
    if (part_bytes == 0) throw py::value_error("LMCachePlugin: part_bytes must be positive");
    options.part_bytes = part_bytes;
    Status s = LMCacheQueue::Create(std::move(db), options, &queue_);
    if (s.IsInvalidArgument()) throw py::value_error(s.ToString());
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }

  ~Plugin() { Close(); }

  int EventFd() { return queue_ ? queue_->event_fd() : -1; }

  uint64_t Submit(BatchOp op, py::handle keys, py::handle buffers, const char* call) {
    BatchRequest request;
    request.op = op;
    request.keys = KeyList(keys, call);
    if (op == BatchOp::kSet || op == BatchOp::kGet) {
      if (!PyList_Check(buffers.ptr()) && !PyTuple_Check(buffers.ptr())) {
        throw py::type_error(std::string(call) + ": memoryviews must be a list");
      }
      py::sequence seq = py::reinterpret_borrow<py::sequence>(buffers);
      if (seq.size() != request.keys.size()) {
        throw py::value_error(std::string(call) + ": " + std::to_string(seq.size()) +
                              " memoryviews for " + std::to_string(request.keys.size()) + " keys");
      }
      auto pins = std::make_shared<BatchPins>();
      pins->Reserve(seq.size());
      for (size_t i = 0; i < seq.size(); ++i) {
        request.buffers.push_back(
            pins->Pin(seq[i], op == BatchOp::kGet,
                      std::string(call) + ": memoryviews[" + std::to_string(i) + "]"));
      }
      request.keepalive = std::move(pins);
    }
    if (!queue_) throw std::runtime_error(std::string(call) + ": the plug-in is closed");
    uint64_t future_id = 0;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = queue_->Submit(std::move(request), &future_id);
    }
    if (!s.ok()) throw std::runtime_error(std::string(call) + ": " + s.ToString());
    return future_id;
  }

  // [(future_id, ok, error, per-key bools or None)], as LMCache's demux thread unpacks.
  py::list Drain() {
    py::list out;
    if (!queue_) return out;
    std::vector<BatchCompletion> done = queue_->Drain();
    for (BatchCompletion& c : done) {
      py::object per_key = py::none();
      if (c.has_per_key) {
        py::list bools(c.per_key.size());
        for (size_t i = 0; i < c.per_key.size(); ++i) {
          bools[i] = py::bool_(c.per_key[i] != 0);
        }
        per_key = std::move(bools);
      }
      out.append(py::make_tuple(c.future_id, c.ok, c.error, per_key));
    }
    return out;  // `done` (and the pins it holds) goes here, with the GIL held
  }

  void SetStore(py::handle store) {
    std::shared_ptr<DB> db = db_of_(store);
    if (!db) throw py::value_error("LMCachePlugin: the store is closed");
    if (queue_) queue_->ReplaceDb(std::move(db));
  }

  void Close() {
    if (!queue_) return;
    {
      py::gil_scoped_release nogil;
      queue_->Close();  // waits for the batches running; they never need the GIL
    }
    queue_->Drain();  // the cancelled batches' pins, released here with the GIL
    queue_.reset();
  }

 private:
  StoreDbGetter db_of_;
  std::unique_ptr<LMCacheQueue> queue_;
};

}  // namespace

void BindLMCachePlugin(py::module_& m, StoreDbGetter db_of) {
  py::class_<Plugin>(m, "LMCachePlugin")
      .def(py::init(
               [db_of](py::handle store, int workers, bool register_buffers, uint64_t part_bytes) {
                 return new Plugin(db_of, store, workers, register_buffers, part_bytes);
               }),
           py::arg("store"), py::arg("num_workers") = 4, py::arg("register_buffers") = false,
           py::arg("part_bytes") = uint64_t{64} << 20)
      .def("event_fd", &Plugin::EventFd)
      .def(
          "submit_batch_set",
          [](Plugin& p, py::handle keys, py::handle views) {
            return p.Submit(BatchOp::kSet, keys, views, "submit_batch_set");
          },
          py::arg("keys"), py::arg("memoryviews"))
      .def(
          "submit_batch_get",
          [](Plugin& p, py::handle keys, py::handle views) {
            return p.Submit(BatchOp::kGet, keys, views, "submit_batch_get");
          },
          py::arg("keys"), py::arg("memoryviews"))
      .def(
          "submit_batch_exists",
          [](Plugin& p, py::handle keys) {
            return p.Submit(BatchOp::kExists, keys, py::none(), "submit_batch_exists");
          },
          py::arg("keys"))
      .def(
          "submit_batch_delete",
          [](Plugin& p, py::handle keys) {
            return p.Submit(BatchOp::kDelete, keys, py::none(), "submit_batch_delete");
          },
          py::arg("keys"))
      .def("drain_completions", &Plugin::Drain)
      .def("_set_store", &Plugin::SetStore, py::arg("store"))
      .def("close", &Plugin::Close);
}

}  // namespace python
}  // namespace kvengine
