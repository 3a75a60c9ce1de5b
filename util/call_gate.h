// CallGate: lets calls in until it is closed, and lets Close() wait for the calls
// already inside -- the job a shared mutex does for "readers" that are whole calls and a
// "writer" that only ever shuts the door (a namespace's handle: DropNamespace and the
// DB's Close wait for its calls in flight, and later calls are refused).
//
// Why not a SharedMutex: this sits on every call of a namespace's handle, and a shared
// lock and unlock of pthread's rwlock are ~60 instructions and two atomic
// read-modify-writes where this is one each way (docs/benchmarks.md, "What a namespace
// costs a put and a get").  The count and the closed flag are a Dekker pair: a call
// adds itself and then looks at the flag, Close() sets the flag and then looks at the
// count, both sequentially consistent, so either the call sees the gate closed or
// Close() sees the call.
//
// Thread-safety: every method from any thread.  A call inside must not Close() the gate
// it is in (it would wait for itself).
#ifndef KVENGINE_UTIL_CALL_GATE_H_
#define KVENGINE_UTIL_CALL_GATE_H_

#include <atomic>
#include <cstdint>

namespace kvengine {

class CallGate {
 public:
  CallGate() = default;
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // Whether the call may go on; when true, it must Exit() when done.
  bool Enter() {
    calls_.fetch_add(1, std::memory_order_seq_cst);
    if (!closed_.load(std::memory_order_seq_cst)) return true;
    Exit();
    return false;
  }

  void Exit() {
    if (calls_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        closed_.load(std::memory_order_seq_cst)) {
      calls_.notify_all();  // the last call out of a closed gate: Close() may wait for it
    }
  }

  // Refuses every later Enter() and returns once every call inside has exited.
  // Closing a closed gate only waits again.
  void Close() {
    closed_.store(true, std::memory_order_seq_cst);
    for (uint32_t inside = calls_.load(std::memory_order_seq_cst); inside != 0;
         inside = calls_.load(std::memory_order_seq_cst)) {
      calls_.wait(inside, std::memory_order_seq_cst);
    }
  }

  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint32_t> calls_{0};
  std::atomic<bool> closed_{false};
};

// Inside a CallGate for the lifetime of a scope, when entered() is true.
class CallGateEntry {
 public:
  explicit CallGateEntry(CallGate* gate) : gate_(gate), entered_(gate->Enter()) {}
  ~CallGateEntry() {
    if (entered_) gate_->Exit();
  }
  CallGateEntry(const CallGateEntry&) = delete;
  CallGateEntry& operator=(const CallGateEntry&) = delete;

  bool entered() const { return entered_; }

 private:
  CallGate* const gate_;
  const bool entered_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_CALL_GATE_H_
