// The input rules of include/kvengine/db.h, written once.
//
// Every DB implementation (DBImpl, AttachedDB, ClusterDB and PeerRouter's batches) and
// every server checks a call's input with these, so a rule and its message are the same
// wherever a call enters, and each failure names the problem (db.h's promise).  A check
// changes nothing: the caller stops before touching any state.
//
// The buffer rules (a null buffer only with length 0) are in util/printable.h
// (CheckNoNullBuffer), beside the other messages that name a key.
#ifndef KVENGINE_UTIL_INPUT_CHECK_H_
#define KVENGINE_UTIL_INPUT_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine::input {

// A key is 1 to max_key_size bytes, any bytes.
Status CheckKey(const Slice& key, uint64_t max_key_size);

// A value of `size` bytes is at most max_value_size.
Status CheckValueSize(const Slice& key, uint64_t size, uint64_t max_value_size);

// A key of the default namespace does not start with the byte of namespaced keys (0xFE,
// util/namespace_key.h): such a key could match, overwrite or delete a key of a namespace.
Status CheckDefaultNamespaceKey(const Slice& key);

// A key given to a namespace's handle: 1 byte to max_key_size less the namespace's key
// prefix (util/namespace_key.h), so that the key stored fits max_key_size.
Status CheckNamespacedKey(const Slice& key, uint64_t max_key_size);

// The longest name of a namespace or a tenant.
inline constexpr size_t kMaxNameBytes = 64;

// A namespace's name: 1 to 64 bytes of letters, digits, '.', '_' and '-' (it appears in
// messages, kv_ldb flags and, later, metric labels), and not "default", the name of the
// namespace every DB has.
Status CheckNamespaceName(std::string_view name);

// A tenant's name in a peer token file (transport/tenant_tokens.h): 1 to 64 bytes of
// letters, digits, '.', '_' and '-', as a namespace's (it appears in messages, logs and
// the kvengine_peer_permission_denied_total{tenant} label).
Status CheckTenantName(std::string_view name);

// A batch call's lists: `results` is not null, the `others` (values or destinations,
// named by `what`) are as many as the keys, and there are at most max_batch_size keys
// (when max_batch_size is 0 the count is not limited here: a layer that forwards the
// batch leaves that limit to the DB that owns the keys).  `call` names the call in the
// messages ("BatchPut").
Status CheckBatch(const char* call, const void* results, size_t keys, size_t others,
                  const char* what, uint64_t max_batch_size);

// A layer-wise load's input (DB::BatchGetIntoGroups): CheckBatch's rules without a
// batch limit (each group is a batch of its own for the DB below), and group ends that
// never fall and end at `keys` (at least one group when there are keys).  On failure
// *results, when not null, is cleared.
Status CheckGroupedBatch(std::vector<int64_t>* results, size_t keys, size_t destinations,
                         std::span<const size_t> group_ends);

// BatchPut names each key once: which of two values should win is ambiguous, so such a
// batch writes nothing.
Status CheckUniqueKeys(std::span<const Slice> keys);

// RegisterBuffer's region: not null, not empty, not wrapping around the address space.
// (Overlap with a registered region is RegionMap's to check: util/region_map.h.)
Status CheckRegion(const void* addr, size_t length);

}  // namespace kvengine::input

#endif  // KVENGINE_UTIL_INPUT_CHECK_H_
