// The metadata of the attach protocol's namespace requests (wire::kUseNamespace ..
// wire::kListNamespaces, docs/attach.md "Namespaces"), encoded and decoded once for
// both ends.  Every Get* returns false, its output unspecified, on bytes that do not
// parse.
#ifndef KVENGINE_ATTACH_NAMESPACE_WIRE_H_
#define KVENGINE_ATTACH_NAMESPACE_WIRE_H_

#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"

namespace kvengine {
namespace wire {

// CREATE_NAMESPACE: the name, then the options (fixed64 memory quota, fixed64 SSD
// quota, fixed32 weight).
void PutCreateNamespace(std::string* dst, const std::string& name, const NamespaceOptions& options);
bool GetCreateNamespace(std::string_view* in, std::string* name, NamespaceOptions* options);

// LIST_NAMESPACES' answer after its status: fixed32 count, then per namespace its name,
// fixed64 id, its options as above and one byte `dropping`.
void PutNamespaceList(std::string* dst, const std::vector<NamespaceInfo>& namespaces);
bool GetNamespaceList(std::string_view* in, std::vector<NamespaceInfo>* namespaces);

}  // namespace wire
}  // namespace kvengine

#endif  // KVENGINE_ATTACH_NAMESPACE_WIRE_H_
