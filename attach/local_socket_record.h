// The LOCAL_SOCKET record: the file in a DB directory that names the Unix socket its
// owner serves attached processes on (Options::local_listen), so that DB::Open of the
// directory by another process, which finds its LOCK taken, attaches instead
// (docs/attach.md).  It holds the socket's absolute path and nothing else; it is
// written while the owner serves and removed when it stops, and a record left by an
// owner that died is removed by the next owner that does not serve.
//
// Read and written through the Env, as every file of the DB directory is.
#ifndef KVENGINE_ATTACH_LOCAL_SOCKET_RECORD_H_
#define KVENGINE_ATTACH_LOCAL_SOCKET_RECORD_H_

#include <string>

#include "kvengine/env.h"
#include "kvengine/status.h"

namespace kvengine {

inline constexpr const char* kLocalSocketFile = "LOCAL_SOCKET";

// Writes `dir`'s record naming `socket_path`.
Status WriteLocalSocketRecord(Env* env, const std::string& dir, const std::string& socket_path);

// Stores the socket path `dir`'s record names in *socket_path.  NotFound when there is
// no record, or an empty one.
Status ReadLocalSocketRecord(Env* env, const std::string& dir, std::string* socket_path);

// Removes `dir`'s record, when there is one.
void RemoveLocalSocketRecord(Env* env, const std::string& dir);

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_LOCAL_SOCKET_RECORD_H_
