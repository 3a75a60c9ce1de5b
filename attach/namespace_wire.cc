#include "attach/namespace_wire.h"

#include "util/coding.h"

namespace kvengine {
namespace wire {

namespace {

void PutOptions(std::string* dst, const NamespaceOptions& options) {
  PutFixed64(dst, options.memory_quota_bytes);
  PutFixed64(dst, options.ssd_quota_bytes);
  PutFixed32(dst, options.weight);
}

bool GetOptions(std::string_view* in, NamespaceOptions* options) {
  return GetFixed64(in, &options->memory_quota_bytes) &&
         GetFixed64(in, &options->ssd_quota_bytes) && GetFixed32(in, &options->weight);
}

}  // namespace

void PutCreateNamespace(std::string* dst, const std::string& name,
                        const NamespaceOptions& options) {
  PutLengthPrefixed(dst, name);
  PutOptions(dst, options);
}

bool GetCreateNamespace(std::string_view* in, std::string* name, NamespaceOptions* options) {
  std::string_view n;
  if (!GetLengthPrefixed(in, &n) || !GetOptions(in, options)) return false;
  name->assign(n);
  return true;
}

void PutNamespaceList(std::string* dst, const std::vector<NamespaceInfo>& namespaces) {
  PutFixed32(dst, static_cast<uint32_t>(namespaces.size()));
  for (const NamespaceInfo& n : namespaces) {
    PutLengthPrefixed(dst, n.name);
    PutFixed64(dst, n.id);
    PutOptions(dst, n.options);
    dst->push_back(n.dropping ? 1 : 0);
  }
}

bool GetNamespaceList(std::string_view* in, std::vector<NamespaceInfo>* namespaces) {
  uint32_t count = 0;
  if (!GetFixed32(in, &count)) return false;
  // Each record takes at least 30 bytes: a count larger than the bytes left is garbage.
  if (count > in->size() / 30) return false;
  namespaces->assign(count, NamespaceInfo());
  for (NamespaceInfo& n : *namespaces) {
    std::string_view name;
    if (!GetLengthPrefixed(in, &name) || !GetFixed64(in, &n.id) || !GetOptions(in, &n.options) ||
        in->empty()) {
      return false;
    }
    n.name.assign(name);
    n.dropping = (*in)[0] != 0;
    in->remove_prefix(1);
  }
  return true;
}

}  // namespace wire
}  // namespace kvengine
