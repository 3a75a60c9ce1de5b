#include "attach/local_counters.h"

#include <cstdio>

namespace kvengine {

void LocalServerCounters::AppendText(std::string* out) const {
#define KV_LOCAL_COUNTER_TEXT(name, help) \
  *out += "local." #name ": " + std::to_string(name.load()) + "\n";
  KV_LOCAL_SERVER_COUNTERS(KV_LOCAL_COUNTER_TEXT)
#undef KV_LOCAL_COUNTER_TEXT
}

void LocalServerCounters::AddToJson(std::string* out) const {
  if (out->empty() || out->back() != '}') return;
  out->pop_back();
  std::string local;
#define KV_LOCAL_COUNTER_JSON(name, help) \
  local += (local.empty() ? "" : ",") + std::string("\"" #name "\":") + std::to_string(name.load());
  KV_LOCAL_SERVER_COUNTERS(KV_LOCAL_COUNTER_JSON)
#undef KV_LOCAL_COUNTER_JSON
  *out += ",\"local\":{" + local + "}}";
}

namespace {

// As the DB's own families: HELP, TYPE, one unlabelled sample printed "%.17g".
void CounterFamily(std::string* out, const char* metric, const char* help, uint64_t value) {
  char sample[64];
  std::snprintf(sample, sizeof(sample), " %.17g\n", static_cast<double>(value));
  *out += std::string("# HELP ") + metric + " " + help + "\n# TYPE " + metric + " counter\n" +
          metric + sample;
}

}  // namespace

void LocalServerCounters::AppendPrometheus(std::string* out) const {
#define KV_LOCAL_COUNTER_FAMILY(name, help) \
  CounterFamily(out, "kvengine_local_" #name "_total", help, name.load());
  KV_LOCAL_SERVER_COUNTERS(KV_LOCAL_COUNTER_FAMILY)
#undef KV_LOCAL_COUNTER_FAMILY
}

void AttachedClientCounters::CountResults(const Status& call, size_t keys,
                                          const std::vector<int64_t>& results,
                                          std::atomic<uint64_t>* done, std::atomic<uint64_t>* bytes,
                                          std::atomic<uint64_t>* failed,
                                          std::atomic<uint64_t>* missing) {
  if (!call.ok() || results.size() != keys) {
    failed->fetch_add(keys, std::memory_order_relaxed);
    return;
  }
  const int64_t not_found = Status::NotFound("").ErrorCode();
  for (int64_t r : results) {
    if (r >= 0) {
      done->fetch_add(1, std::memory_order_relaxed);
      if (bytes != nullptr) bytes->fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    } else if (r == not_found && missing != nullptr) {
      missing->fetch_add(1, std::memory_order_relaxed);
    } else {
      failed->fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void AttachedClientCounters::AppendPrometheus(std::string* out) const {
#define KV_CLIENT_COUNTER_FAMILY(name, help) \
  CounterFamily(out, "kvengine_client_" #name "_total", help, name.load());
  KV_ATTACHED_CLIENT_COUNTERS(KV_CLIENT_COUNTER_FAMILY)
#undef KV_CLIENT_COUNTER_FAMILY
}

}  // namespace kvengine
