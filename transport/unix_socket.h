// Unix domain sockets for the processes of one host: listening with access control,
// passing a file descriptor (SCM_RIGHTS), and reading whole frames (wire.h) without a
// body.  The local server (attach/local_server.h) and attached clients
// (attach/attached_db.h) use these; frames and their checksums are the peer protocol's.
#ifndef KVENGINE_TRANSPORT_UNIX_SOCKET_H_
#define KVENGINE_TRANSPORT_UNIX_SOCKET_H_

#include <sys/types.h>

#include <atomic>
#include <string>

#include "kvengine/status.h"
#include "transport/socket_util.h"
#include "transport/wire.h"

namespace kvengine {

// Binds and listens on `path` (non-blocking).  A stale socket file left by a dead owner
// is replaced; a path where something is still accepting connections fails with Busy.
// The file gets permission bits `mode` and, when `group` is not empty, that group (a
// name or a number).
Status ListenUnix(const std::string& path, mode_t mode, const std::string& group, int* fd);
// Connects a non-blocking socket to `path` by `deadline`.
Status ConnectUnix(const std::string& path, Deadline deadline, int* fd);

// The uid and pid of the process at the other end (SO_PEERCRED).
Status PeerCredentials(int fd, uid_t* uid, pid_t* pid);

// Sends one byte carrying `fd_to_send` (or no descriptor when it is -1) by `deadline`.
Status SendDescriptor(int fd, int fd_to_send, Deadline deadline);
// Receives what SendDescriptor sent; *received is -1 when no descriptor came.
Status ReceiveDescriptor(int fd, Deadline deadline, int* received);

// Reads one whole frame without a body and checks its checksum.  While nothing of it
// has arrived, `stop` (when set) turning true gives up with Aborted.
Status ReadFrame(int fd, Deadline deadline, wire::FrameHeader* header, std::string* meta,
                 const std::atomic<bool>* stop = nullptr);

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_UNIX_SOCKET_H_
