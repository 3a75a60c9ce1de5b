#include "transport/tenant_tokens.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "transport/wire.h"
#include "util/input_check.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine {

namespace {

// The words of a line, split at spaces and tabs.
std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) i++;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') i++;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

std::string_view TrimEnd(std::string_view s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// Fills *entry from the words of a "tenant" line; the message says what is wrong.
Status ParseTenantLine(const std::vector<std::string_view>& words, TenantEntry* entry) {
  if (words[0] != "tenant") {
    return Status::InvalidArgument("'" + std::string(words[0]) +
                                   "': a line is 'tenant NAME TOKEN NAMESPACE...'");
  }
  if (words.size() < 4) {
    return Status::InvalidArgument(
        "a line is 'tenant NAME TOKEN NAMESPACE...' (a namespace's name, 'default' or '*')");
  }
  Status s = input::CheckTenantName(words[1]);
  if (!s.ok()) return s;
  entry->name = words[1];
  entry->token = words[2];
  for (size_t i = 3; i < words.size(); i++) {
    const std::string_view w = words[i];
    if (w == "*") {
      entry->every_namespace = true;
    } else if (w == "default") {
      entry->default_namespace = true;
    } else {
      s = input::CheckNamespaceName(w);
      if (!s.ok()) return s;
      entry->namespaces.emplace_back(w);
    }
  }
  return Status::OK();
}

// Refuses a name or a token that an earlier tenant has.
Status CheckUnique(const std::vector<TenantEntry>& earlier, const TenantEntry& e) {
  for (const TenantEntry& o : earlier) {
    if (o.name == e.name) {
      return Status::InvalidArgument("tenant '" + e.name + "' is named again (first on line " +
                                     std::to_string(o.line) + ")");
    }
    if (o.token == e.token) {
      return Status::InvalidArgument("tenant '" + e.name + "' has the token of tenant '" + o.name +
                                     "' (line " + std::to_string(o.line) + ")");
    }
  }
  return Status::OK();
}

Status ParseTenantLines(std::string_view text, const std::string& path,
                        std::vector<TenantEntry>* entries) {
  std::vector<TenantEntry> out;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line = TrimEnd(text.substr(pos, end - pos));
    pos = end + 1;
    line_no++;
    if (line_no == 1) continue;  // the header, checked by the caller
    const std::vector<std::string_view> words = Words(line);
    if (words.empty() || words[0].starts_with('#')) continue;
    TenantEntry e;
    e.line = line_no;
    Status s = ParseTenantLine(words, &e);
    if (s.ok()) s = CheckUnique(out, e);
    if (!s.ok()) {
      return Status::InvalidArgument("token file " + path + " line " + std::to_string(line_no),
                                     s.message());
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) {
    return Status::InvalidArgument("token file " + path + " names no tenant",
                                   "add lines 'tenant NAME TOKEN NAMESPACE...'");
  }
  *entries = std::move(out);
  return Status::OK();
}

std::string HexId(uint64_t id) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(id));
  return buf;
}

}  // namespace

Status ParseTenantTokens(std::string_view text, const std::string& path,
                         std::vector<TenantEntry>* entries) {
  const std::string_view first = TrimEnd(text.substr(0, text.find('\n')));
  if (first.starts_with("kvengine-tokens")) {
    if (first != kTenantTokensHeader) {
      return Status::InvalidArgument("token file " + path + " line 1",
                                     "'" + std::string(first) + "': this build reads '" +
                                         std::string(kTenantTokensHeader) + "'");
    }
    return ParseTenantLines(text, path, entries);
  }
  const std::string_view token = TrimEnd(text);
  if (token.empty()) return Status::InvalidArgument("auth token file " + path + " is empty");
  *entries = TenantTable::OldForm(std::string(token));
  return Status::OK();
}

Status ReadTenantTokens(const std::string& path, std::vector<TenantEntry>* entries) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument("cannot read auth token file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTenantTokens(ss.str(), path, entries);
}

// ---------------------------------------------------------------- Tenant

Tenant::Tenant(const TenantEntry& entry, const TenantTable* table)
    : name_(entry.name),
      token_(entry.token),
      every_namespace_(entry.every_namespace),
      default_namespace_(entry.default_namespace),
      table_(table) {
  for (const std::string& n : entry.namespaces) ids_.push_back(ns::IdOf(n));
  std::sort(ids_.begin(), ids_.end());
  if (!every_namespace_) {
    std::set<std::string> names(entry.namespaces.begin(), entry.namespaces.end());
    if (default_namespace_) names.insert("");
    figures_ = FigureScope::Of("tenant '" + name_ + "'", false, names);
  }
}

bool Tenant::Allows(const Slice& key) const {
  const std::string_view k(key.data(), key.size());
  if (!ns::IsNamespaced(k)) return default_namespace_;
  return k.size() >= ns::kPrefixSize && AllowsNamespace(ns::IdOfKey(k));
}

Status Tenant::Permit(std::span<const Slice> keys) const {
  if (every_namespace_) return Status::OK();
  for (const Slice& key : keys) {
    if (key.data() == nullptr || Allows(key)) continue;
    const std::string_view k(key.data(), key.size());
    std::string which;
    if (!ns::IsNamespaced(k)) {
      which = "the default namespace";
    } else if (k.size() < ns::kPrefixSize) {
      which = "no namespace (a key of " + std::to_string(k.size()) +
              " bytes shorter than a namespace's prefix)";
    } else {
      which = "namespace " + table_->NamespaceName(ns::IdOfKey(k));
    }
    return Status::PermissionDenied("tenant '" + name_ + "' may not use " + which + " (key " +
                                    Printable(key) + ")");
  }
  return Status::OK();
}

std::string Tenant::Restrict(const std::string& pattern) const {
  // A lookahead for the key's first bytes (one of the tenant's prefixes, or a first byte
  // other than 0xFE for the default namespace), then the pattern over the whole key.
  std::string ahead;
  for (uint64_t id : ids_) {
    if (!ahead.empty()) ahead += '|';
    ahead += ns::PrefixPattern(id);
  }
  if (default_namespace_) ahead += ahead.empty() ? "[^\\xfe]" : "|[^\\xfe]";
  // Bound to nothing a key can have: a lookahead nothing passes.
  if (ahead.empty()) ahead = "[^\\x00-\\xff]";
  return "(?=" + ahead + ")(?:" + pattern + ")";
}

// ---------------------------------------------------------------- TenantTable

TenantTable::TenantTable(const std::vector<TenantEntry>& entries) {
  for (const TenantEntry& e : entries) {
    tenants_.push_back(std::make_unique<Tenant>(e, this));
    if (e.name.empty()) old_form_ = true;
    by_name_[e.name] = tenants_.back().get();
    for (const std::string& n : e.namespaces) namespace_names_[ns::IdOf(n)] = n;
  }
}

std::vector<TenantEntry> TenantTable::OldForm(const std::string& token) {
  TenantEntry e;
  e.token = token;
  e.every_namespace = true;
  e.default_namespace = true;
  return {e};
}

const Tenant* TenantTable::Authenticate(std::string_view nonce, std::string_view name,
                                        uint64_t proof) const {
  if (!name.empty() && !old_form_) {
    const auto it = by_name_.find(std::string(name));
    // An unknown name costs a proof too (of a token no tenant has), and is refused.
    const std::string_view token = it != by_name_.end() ? it->second->token() : std::string_view();
    const bool match = wire::AuthProof(nonce, token) == proof;
    return it != by_name_.end() && match ? it->second : nullptr;
  }
  for (const auto& t : tenants_) {
    if (wire::AuthProof(nonce, t->token()) == proof) return t.get();
  }
  return nullptr;
}

std::string TenantTable::NamespaceName(uint64_t id) const {
  const auto it = namespace_names_.find(id);
  return it != namespace_names_.end() ? "'" + it->second + "'" : "of id " + HexId(id);
}

}  // namespace kvengine
