#include "attach/local_access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "util/input_check.h"

namespace kvengine {

namespace {

constexpr std::string_view kDefaultScope = "default";
constexpr std::string_view kEveryScope = "*";
constexpr std::string_view kAdminScope = "@admin";

// A grant that allows everything: an entry without '=', the owner, root.
LocalGrant Everything() {
  LocalGrant g;
  g.every = true;
  g.admin = true;
  return g;
}

// Parses a decimal id (all digits, no sign, fits in 32 bits).
bool ParseId(std::string_view text, uint32_t* id) {
  if (text.empty() || text.size() > 10) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > 0xffffffffull) return false;
  *id = static_cast<uint32_t>(v);
  return true;
}

Status ParseGrant(std::string_view text, LocalGrant* grant) {
  if (text.empty()) return Status::InvalidArgument("nothing after '='");
  while (true) {
    const size_t plus = text.find('+');
    const std::string_view scope = text.substr(0, plus);
    if (scope == kEveryScope) {
      grant->every = true;
    } else if (scope == kAdminScope) {
      grant->admin = true;
    } else if (scope == kDefaultScope) {
      grant->names.insert("");
    } else {
      Status s = input::CheckNamespaceName(scope);
      if (!s.ok()) return s;
      grant->names.insert(std::string(scope));
    }
    if (plus == std::string_view::npos) return Status::OK();
    text.remove_prefix(plus + 1);
  }
}

}  // namespace

void LocalGrant::Merge(const LocalGrant& other) {
  every |= other.every;
  admin |= other.admin;
  names.insert(other.names.begin(), other.names.end());
}

std::string LocalGrant::ToString() const {
  std::string out;
  auto add = [&out](std::string_view scope) {
    if (!out.empty()) out += '+';
    out += scope;
  };
  if (every) add(kEveryScope);
  for (const std::string& n : names) add(n.empty() ? kDefaultScope : std::string_view(n));
  if (admin) add(kAdminScope);
  return out.empty() ? "nothing" : out;
}

Status LocalPeer::Of(int fd, LocalPeer* peer) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::IOError("SO_PEERCRED", std::strerror(errno));
  }
  peer->uid = cred.uid;
  peer->gid = cred.gid;
  peer->pid = cred.pid;
  peer->groups.assign(64, 0);
  len = static_cast<socklen_t>(peer->groups.size() * sizeof(gid_t));
  int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer->groups.data(), &len);
  if (rc != 0 && errno == ERANGE) {  // len now says how much room the list needs
    peer->groups.assign(len / sizeof(gid_t), 0);
    rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer->groups.data(), &len);
  }
  if (rc == 0) {
    peer->groups.resize(len / sizeof(gid_t));
    return Status::OK();
  }
  peer->groups.clear();
  if (errno != ENOPROTOOPT) return Status::IOError("SO_PEERGROUPS", std::strerror(errno));
  // An old kernel: the groups the uid's entry in the group database gives it.
  passwd pw{}, *found = nullptr;
  std::vector<char> buffer(16384);
  if (getpwuid_r(peer->uid, &pw, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return Status::OK();  // a uid without an entry: its primary group only
  }
  int count = 64;
  peer->groups.assign(static_cast<size_t>(count), 0);
  if (getgrouplist(pw.pw_name, peer->gid, peer->groups.data(), &count) < 0) {
    peer->groups.assign(static_cast<size_t>(count), 0);
    if (getgrouplist(pw.pw_name, peer->gid, peer->groups.data(), &count) < 0) count = 0;
  }
  peer->groups.resize(static_cast<size_t>(count));
  return Status::OK();
}

Status LocalAccess::Parse(const std::string& spec, uid_t owner_uid, LocalAccess* access) {
  LocalAccess parsed;
  parsed.owner_uid_ = owner_uid;
  std::string_view rest(spec);
  while (!rest.empty()) {
    const size_t comma = rest.find_first_of(",;");
    const std::string_view entry = rest.substr(0, comma);
    rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    std::string_view principal = entry.substr(0, eq);
    const bool group = principal.starts_with("gid:");
    if (group || principal.starts_with("uid:")) principal.remove_prefix(4);
    auto bad = [&entry](const std::string& why) {
      return Status::InvalidArgument("local_allowed_uids: entry '" + std::string(entry) +
                                     "': " + why);
    };
    uint32_t id = 0;
    if (!ParseId(principal, &id)) {
      return bad("'" + std::string(principal) +
                 "' is not a uid or gid (write N, uid:N or gid:N, N a number)");
    }
    LocalGrant grant = Everything();
    if (eq != std::string_view::npos) {
      grant = LocalGrant();
      Status s = ParseGrant(entry.substr(eq + 1), &grant);
      if (!s.ok()) return bad(s.message());
    }
    (group ? parsed.gids_[id] : parsed.uids_[id]).Merge(grant);
  }
  *access = std::move(parsed);
  return Status::OK();
}

bool LocalAccess::Admit(const LocalPeer& peer, LocalGrant* grant) const {
  *grant = LocalGrant();
  if (peer.uid == owner_uid_ || peer.uid == 0) {
    *grant = Everything();
    return true;
  }
  bool admitted = false;
  auto add = [&](const LocalGrant& g) {
    grant->Merge(g);
    admitted = true;
  };
  if (auto it = uids_.find(peer.uid); it != uids_.end()) add(it->second);
  if (auto it = gids_.find(peer.gid); it != gids_.end()) add(it->second);
  for (gid_t g : peer.groups) {
    if (g == peer.gid) continue;
    if (auto it = gids_.find(g); it != gids_.end()) add(it->second);
  }
  return admitted;
}

}  // namespace kvengine
