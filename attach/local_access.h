// LocalAccess: which processes of this host may attach to an owner, and which of its
// namespaces each may use (Options::local_allowed_uids; docs/attach.md, "Who may attach,
// and to what").
//
// The option is a list of entries separated by ',' (or ';', for where the option sits
// inside a comma-separated list itself, as in kv_server --options=...):
//   entry     := principal [ '=' grant ]
//   principal := N | 'uid:' N | 'gid:' N        (a plain N is a uid)
//   grant     := scope { '+' scope }
//   scope     := NAME | 'default' | '*' | '@admin'
// A NAME is a namespace (input::CheckNamespaceName), 'default' the default namespace
// (a name no namespace may take), '*' every namespace, the default one included, and
// '@admin' lets the client create and drop the namespaces its grant names (all of them
// with '*').  An entry without a grant is '*+@admin': "1001,1002", today's plain list,
// keeps its meaning.  A gid entry matches a client whose primary or supplementary group
// it is; a client matched by several entries gets the union of their grants.  The
// owner's own uid and root always attach with '*+@admin'.
//
// Thread-safety: immutable after Parse; LocalGrant is a value.
#ifndef KVENGINE_ATTACH_LOCAL_ACCESS_H_
#define KVENGINE_ATTACH_LOCAL_ACCESS_H_

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvengine/status.h"

namespace kvengine {

// What one attached client may do.
struct LocalGrant {
  bool every = false;           // every namespace, the default one included
  bool admin = false;           // may create and drop the namespaces it may use
  std::set<std::string> names;  // the namespaces it may use; "" is the default namespace

  // Whether the client may use namespace `name` ("": the default namespace).
  bool Allows(const std::string& name) const { return every || names.count(name) != 0; }
  // Adds what `other` allows.
  void Merge(const LocalGrant& other);
  // The grant in the option's syntax ("tenantA+default+@admin"), for messages.
  std::string ToString() const;
};

// The credentials of the process at the other end of a Unix socket, as the kernel
// reports them (SO_PEERCRED, SO_PEERGROUPS): not what the client says of itself.
struct LocalPeer {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  std::vector<gid_t> groups;  // supplementary groups

  // Reads them for the connected socket `fd`; the supplementary groups, where the kernel
  // cannot report them (before Linux 4.13), from the uid's entry in the group database.
  static Status Of(int fd, LocalPeer* peer);
};

class LocalAccess {
 public:
  // Parses `spec` (the syntax above) for an owner running as `owner_uid`.
  // InvalidArgument naming the entry and what is wrong with it; *access unchanged then.
  static Status Parse(const std::string& spec, uid_t owner_uid, LocalAccess* access);

  // Whether `peer` may attach at all; when it may, *grant is what it may do.
  bool Admit(const LocalPeer& peer, LocalGrant* grant) const;

 private:
  uid_t owner_uid_ = 0;
  std::map<uid_t, LocalGrant> uids_;
  std::map<gid_t, LocalGrant> gids_;
};

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_LOCAL_ACCESS_H_
