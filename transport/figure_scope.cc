#include "transport/figure_scope.h"

#include <cstdlib>

#include "util/namespace_key.h"

namespace kvengine {

namespace {

// How a property's answer is cut for a scope of some namespaces.
enum class Cut { kNone, kStatsText, kStatsJson, kPrometheus, kOptions };

// The properties a scope of some namespaces may read, and how each is cut; kNone with
// false: refused.
bool Listed(std::string_view name, Cut* cut) {
  static constexpr struct {
    std::string_view name;
    Cut cut;
  } kListed[] = {
      {"kvengine.stats", Cut::kStatsText},
      {"kvengine.stats.json", Cut::kStatsJson},
      {"kvengine.stats.prometheus", Cut::kPrometheus},
      {"kvengine.prometheus", Cut::kPrometheus},
      {"kvengine.metrics", Cut::kPrometheus},
      {"kvengine.options", Cut::kOptions},
      {"kvengine.readiness", Cut::kNone},  // whether the DB serves, nothing of the tenants
      {"kvengine.namespace", Cut::kNone},  // a handle's own name
      // The boot epoch: a tenant's router tells a restarted store by it (READ_RESIDENT's
      // snapshot carries it too); a random number, nothing of the other tenants.
      {"kvengine.epoch", Cut::kNone},
  };
  for (const auto& p : kListed) {
    if (p.name == name) {
      *cut = p.cut;
      return true;
    }
  }
  return false;
}

// Calls keep(line) for each line of `text` (without its '\n') and keeps those it
// accepts, each ended by '\n'.
template <class Keep>
std::string KeepLines(std::string_view text, Keep keep) {
  std::string out;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    if (keep(line)) {
      out.append(line);
      out += '\n';
    }
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

constexpr std::string_view kTextPrefix = "namespace.";        // namespace.NAME.FIGURE: N
constexpr std::string_view kJsonMember = "\"namespaces\":{";  // "NAME":{"FIGURE":N,...}
constexpr std::string_view kFamilyPrefix = "kvengine_namespace_";
constexpr std::string_view kLabel = "namespace=\"";

}  // namespace

FigureScope FigureScope::Of(std::string who, bool every, const std::set<std::string>& names) {
  FigureScope scope;
  scope.whole_ = false;
  scope.every_ = every;
  scope.who_ = std::move(who);
  scope.names_ = names;
  for (const std::string& n : names) {
    if (!n.empty()) scope.ids_.insert(ns::IdOf(n));
  }
  return scope;
}

bool FigureScope::Shows(std::string_view label) const {
  if (whole_ || every_) return true;
  if (label == "default") return names_.count("") != 0;
  if (label.starts_with("id:")) {  // a namespace no registry names: by its id
    const std::string hex(label.substr(3));
    char* end = nullptr;
    const uint64_t id = std::strtoull(hex.c_str(), &end, 16);
    return hex.size() == 16 && *end == '\0' && ids_.count(id) != 0;
  }
  return names_.count(std::string(label)) != 0;
}

bool FigureScope::IsPrivateOption(std::string_view option) {
  // Who may connect, with what credentials, and where the DB's other doors and logs are.
  static constexpr std::string_view kPrivate[] = {
      "local_allowed_uids",
      "local_listen_group",
      "peer_auth_token_file",
      "peers",
      "cluster",
      "listen",
      "metrics_listen",
      "log_file",
  };
  for (std::string_view p : kPrivate) {
    if (p == option) return true;
  }
  return false;
}

Status FigureScope::Admit(const std::string& name) const {
  Cut cut;
  if (whole_ || Listed(name, &cut)) return Status::OK();
  return Status::PermissionDenied(who_ + " may not read property '" + name +
                                  "': it describes the whole DB, every tenant's calls; its own "
                                  "namespaces' figures are in kvengine.stats");
}

void FigureScope::Filter(const std::string& name, std::string* value) const {
  Cut cut = Cut::kNone;
  if (whole_ || !Listed(name, &cut)) return;
  switch (cut) {
    case Cut::kNone:
      return;
    case Cut::kStatsText:
      *value = KeepLines(*value, [this](std::string_view line) {
        if (line.starts_with("** ")) return true;  // the heading
        if (!line.starts_with(kTextPrefix)) return false;
        std::string_view rest = line.substr(kTextPrefix.size());
        rest = rest.substr(0, rest.find(": "));  // "id:..." names hold a ':' but no space
        const size_t dot = rest.rfind('.');      // the figure's name has none; NAME may
        return dot != std::string_view::npos && Shows(rest.substr(0, dot));
      });
      return;
    case Cut::kStatsJson: {
      std::string kept;
      const size_t at = value->find(kJsonMember);
      std::string_view in = at == std::string::npos
                                ? std::string_view()
                                : std::string_view(*value).substr(at + kJsonMember.size());
      // Each member "NAME":{...}: names and figures hold no quote or brace.
      while (in.starts_with("\"")) {
        const size_t quote = in.find('"', 1);
        const size_t close = in.find('}');
        if (quote == std::string_view::npos || close == std::string_view::npos) break;
        const std::string_view member = in.substr(0, close + 1);
        if (Shows(in.substr(1, quote - 1))) {
          if (!kept.empty()) kept += ',';
          kept.append(member);
        }
        in.remove_prefix(close + 1);
        if (in.starts_with(",")) in.remove_prefix(1);
      }
      *value = kept.empty() ? "{}" : "{" + std::string(kJsonMember) + kept + "}}";
      return;
    }
    case Cut::kPrometheus:
      *value = KeepLines(*value, [this](std::string_view line) {
        if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
          return line.substr(7).starts_with(kFamilyPrefix);
        }
        if (!line.starts_with(kFamilyPrefix)) return false;
        const size_t at = line.find(kLabel);
        if (at == std::string_view::npos) return false;
        const std::string_view label = line.substr(at + kLabel.size());
        return Shows(label.substr(0, label.find('"')));
      });
      return;
    case Cut::kOptions:
      *value = KeepLines(*value, [](std::string_view line) {
        return !IsPrivateOption(line.substr(0, line.find('=')));
      });
      return;
  }
}

}  // namespace kvengine
