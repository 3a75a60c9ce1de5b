#include "tools/stress/keyspaces.h"

namespace kvengine::stress {

Status Keyspaces::Open(DB* db, const KeySpace* space, uint32_t namespaces, bool create,
                       std::unique_ptr<Keyspaces>* result) {
  std::unique_ptr<Keyspaces> set(new Keyspaces(space));
  set->handles_.push_back(db);
  for (uint32_t i = 1; i <= namespaces; i++) {
    const std::string name = "stress-" + std::to_string(i);
    std::unique_ptr<DB> handle;
    Status s = db->OpenNamespace(name, &handle);
    if (s.IsNotFound() && create) s = db->CreateNamespace(name, NamespaceOptions(), &handle);
    if (!s.ok()) return Status::FromErrorCode(static_cast<int>(s.ErrorCode()),
                                              "namespace " + name + ": " + s.ToString());
    set->handles_.push_back(handle.get());
    set->owned_.push_back(std::move(handle));
  }
  *result = std::move(set);
  return Status::OK();
}

DB* Keyspaces::Other(uint32_t worker, uint64_t pick) const {
  if (handles_.size() < 2) return nullptr;
  const size_t own = worker % handles_.size();
  const size_t other = (own + 1 + pick % (handles_.size() - 1)) % handles_.size();
  return handles_[other];
}

std::string Keyspaces::NameOf(const DB* handle) const {
  for (size_t i = 0; i < handles_.size(); i++) {
    if (handles_[i] == handle) return i == 0 ? "default" : "stress-" + std::to_string(i);
  }
  return "?";
}

}  // namespace kvengine::stress
