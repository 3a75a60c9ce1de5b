// Tenant tokens: who may talk to a peer server, and which namespaces each may touch
// (docs/transport.md, "Tenant tokens").
//
// A peer token file (Options::peer_auth_token_file, kv_server --auth_token_file) is in
// one of two forms:
//
//   the old form    the whole file, trailing newlines and spaces dropped, is one token;
//                   whoever proves it may use every namespace.
//   tenants         a first line "kvengine-tokens 1", then one line per tenant:
//                       tenant NAME TOKEN NAMESPACE...
//                   where each NAMESPACE is a namespace's name, "default" (the default
//                   namespace: keys without the 0xFE prefix) or "*" (every namespace,
//                   the DB as a whole: the old form's rights).  Blank lines and lines
//                   starting with '#' are ignored; words are separated by spaces or tabs.
//
// A server requires one of the file's tokens of every client, and binds the connection
// to the tenant whose token it proved.  A client presents the first tenant of its file
// (its name and token), or the old form's token with no name.
//
// Thread-safety: a TenantTable is immutable after construction but for its counters
// (atomics); its Tenants live as long as it does.
#ifndef KVENGINE_TRANSPORT_TENANT_TOKENS_H_
#define KVENGINE_TRANSPORT_TENANT_TOKENS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "transport/figure_scope.h"

namespace kvengine {

// The first line of a token file of tenants.
inline constexpr std::string_view kTenantTokensHeader = "kvengine-tokens 1";

// One tenant of a token file, as written there.
struct TenantEntry {
  std::string name;  // "" for the old form's token
  std::string token;
  bool every_namespace = false;         // "*"
  bool default_namespace = false;       // "default"
  std::vector<std::string> namespaces;  // the named namespaces
  int line = 0;                         // where the file names it (1-based; 0 for the old form)
};

// Parses a token file's `text` (`path` names it in messages).  InvalidArgument naming the
// file and the line for: a "kvengine-tokens" first line of another version, a line that
// is not "tenant NAME TOKEN NAMESPACE...", a bad tenant or namespace name, a name or a
// token given twice, a file of tenants that names none, an empty file.  *entries is
// unchanged on failure.
Status ParseTenantTokens(std::string_view text, const std::string& path,
                         std::vector<TenantEntry>* entries);
// Reads and parses the file at `path`.
Status ReadTenantTokens(const std::string& path, std::vector<TenantEntry>* entries);

class TenantTable;

// A tenant a connection proved, as the server checks its requests.
class Tenant {
 public:
  Tenant(const TenantEntry& entry, const TenantTable* table);
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  // "" for the old form's token.
  const std::string& name() const { return name_; }
  const std::string& token() const { return token_; }
  // Whether it may use every namespace (the DB as a whole).
  bool unrestricted() const { return every_namespace_; }

  // OK when every key belongs to a namespace the tenant is bound to (a key without the
  // 0xFE prefix: the default namespace); else PermissionDenied naming the tenant, the
  // first key refused and its namespace.
  Status Permit(std::span<const Slice> keys) const;
  // Whether the tenant may use the namespace of id `id`.
  bool AllowsNamespace(uint64_t id) const {
    return every_namespace_ || std::binary_search(ids_.begin(), ids_.end(), id);
  }
  // The DeleteByRegex pattern that matches the keys `pattern` matches (whole, internal
  // keys) within the tenant's namespaces only.  REQUIRES: `pattern` compiles on its own
  // (so that it cannot close the group it is put in), !unrestricted().
  std::string Restrict(const std::string& pattern) const;
  // What the tenant may see of the DB's figures (properties): a tenant of every
  // namespace the whole DB's, any other its namespaces' only (transport/figure_scope.h).
  const FigureScope& figures() const { return figures_; }

  // Requests refused to this tenant.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  void CountRefused() const { refused_.fetch_add(1, std::memory_order_relaxed); }

 private:
  bool Allows(const Slice& key) const;

  const std::string name_;
  const std::string token_;
  const bool every_namespace_;
  const bool default_namespace_;
  std::vector<uint64_t> ids_;  // sorted: the named namespaces' ids
  FigureScope figures_;
  const TenantTable* const table_;
  mutable std::atomic<uint64_t> refused_{0};
};

// Every tenant a server accepts.
class TenantTable {
 public:
  // `entries` as ReadTenantTokens gives them (one unnamed entry: the old form).
  explicit TenantTable(const std::vector<TenantEntry>& entries);
  TenantTable(const TenantTable&) = delete;  // its Tenants point to it
  TenantTable& operator=(const TenantTable&) = delete;
  // The old form: one token, every namespace.
  static std::vector<TenantEntry> OldForm(const std::string& token);

  // Whether a token is required (the table is not empty).
  bool required() const { return !tenants_.empty(); }
  // The tenant `proof` (wire::AuthProof over `nonce`) proves, or nullptr.  With a
  // `name`, that tenant's token only (O(1)); without, each tenant's in turn.  A server
  // of the old form ignores the name.  An unknown name is refused like a wrong token,
  // after as much work, so that the answer does not tell which names exist.
  const Tenant* Authenticate(std::string_view nonce, std::string_view name, uint64_t proof) const;
  // A namespace's name as the file gives it, or "id 0x..." when no tenant names it.
  std::string NamespaceName(uint64_t id) const;
  const std::vector<std::unique_ptr<Tenant>>& tenants() const { return tenants_; }

 private:
  std::vector<std::unique_ptr<Tenant>> tenants_;
  std::unordered_map<std::string, const Tenant*> by_name_;
  std::unordered_map<uint64_t, std::string> namespace_names_;
  bool old_form_ = false;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_TENANT_TOKENS_H_
