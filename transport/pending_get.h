// Grouped gets for transports whose reads are not pipelined over a connection of their
// own (UCX's one-sided reads): the groups read in turn on a thread of their own.
#ifndef KVENGINE_TRANSPORT_PENDING_GET_H_
#define KVENGINE_TRANSPORT_PENDING_GET_H_

#include <memory>
#include <span>
#include <vector>

#include "kvengine/transport.h"

namespace kvengine {

// Transport::StartBatchGetGroups for a transport whose BatchGet runs to its end before
// it returns: starts a thread that makes one `transport->BatchGet` per group, in group
// order, and returns at once.  Group g's call is Ready as soon as its BatchGet has
// returned, while later groups are still being read, so a layer-wise load's consumer
// works on layer g while layer g+1 is on its way, and the calls of several members run
// at the same time.  Keys are copied (the caller's may go once this returns); each
// group's destinations and results must stay valid until its call's Wait returns, as
// StartBatchGetGroups says.  Where no thread can be started, the groups are read here,
// in turn, before it returns.  `transport` must outlive the calls (its destructor
// requires every call waited for, and a call destroyed unwaited waits first).
void StartGroupsInTurnOnAThread(Transport* transport, const Endpoint& peer,
                                std::span<const Transport::GetGroup> groups,
                                std::vector<std::unique_ptr<PendingGet>>* calls);

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_PENDING_GET_H_
