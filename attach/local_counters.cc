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

void LocalServerCounters::AppendPrometheus(std::string* out) const {
  // As the DB's own families: HELP, TYPE, one unlabelled sample printed "%.17g".
  auto family = [out](const char* metric, const char* help, uint64_t value) {
    char sample[64];
    std::snprintf(sample, sizeof(sample), " %.17g\n", static_cast<double>(value));
    *out += std::string("# HELP ") + metric + " " + help + "\n# TYPE " + metric + " counter\n" +
            metric + sample;
  };
#define KV_LOCAL_COUNTER_FAMILY(name, help) \
  family("kvengine_local_" #name "_total", help, name.load());
  KV_LOCAL_SERVER_COUNTERS(KV_LOCAL_COUNTER_FAMILY)
#undef KV_LOCAL_COUNTER_FAMILY
}

}  // namespace kvengine
