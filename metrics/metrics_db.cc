#include "metrics/metrics_db.h"

#include <cstdlib>

namespace kvengine {

Status MetricsDB::Wrap(const Options& options, std::unique_ptr<DB>* db) {
  std::unique_ptr<MetricsDB> layer(new MetricsDB(std::move(*db)));
  Status s = MetricsServer::Start(options.metrics_listen, layer.get(), MetricsServer::Limits(),
                                  &layer->server_);
  if (!s.ok()) {
    *db = std::move(layer->base_);
    return s;
  }
  *db = std::move(layer);
  return Status::OK();
}

MetricsDB::~MetricsDB() {
  if (server_ != nullptr) server_->Stop();  // its threads read base_
  if (base_ != nullptr && !closed_.load()) Close();
}

Status MetricsDB::Close() {
  closed_.store(true);
  return base_ != nullptr ? base_->Close() : Status::OK();
}

bool MetricsDB::GetProperty(const std::string& name, std::string* value) {
  if (name == "kvengine.metrics_listen" && value != nullptr) {
    *value = server_ != nullptr ? server_->address() : "";
    return true;
  }
  return base_->GetProperty(name, value);
}

bool MetricsDB::Metrics(std::string* text) {
  return !closed_.load() && base_->GetProperty("kvengine.metrics", text);
}

uint64_t MetricsDB::Epoch() {
  std::string epoch;
  if (closed_.load() || !base_->GetProperty("kvengine.epoch", &epoch)) return 0;
  return std::strtoull(epoch.c_str(), nullptr, 10);
}

bool MetricsDB::StatsJson(std::string* json) {
  return !closed_.load() && base_->GetProperty("kvengine.stats.json", json);
}

Status MetricsDB::Health() {
  return closed_.load() ? Status::Aborted("DB is closed") : Status::OK();
}

Status MetricsDB::Ready(std::string* detail) {
  detail->clear();
  if (closed_.load()) {
    *detail = "open: not ready: DB is closed\n";
    return Status::Aborted("DB is closed");
  }
  if (!base_->GetProperty("kvengine.readiness", detail)) {
    *detail = "open: not ready: the DB answers no readiness\n";
    return Status::NotSupported("the DB answers no readiness");
  }
  // The first failing check's line: "name: not ready: why".
  const size_t at = detail->find(": not ready: ");
  if (at == std::string::npos) return Status::OK();
  const size_t begin = detail->rfind('\n', at);
  const size_t end = detail->find('\n', at);
  return Status::Busy(detail->substr(begin == std::string::npos ? 0 : begin + 1,
                                     end == std::string::npos
                                         ? std::string::npos
                                         : end - (begin == std::string::npos ? 0 : begin + 1)));
}

}  // namespace kvengine
