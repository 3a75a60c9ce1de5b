// Helpers shared by the Envs' MultiRead implementations.
#ifndef KVENGINE_ENV_MULTI_READ_H_
#define KVENGINE_ENV_MULTI_READ_H_

#include <cstddef>

#include "kvengine/env.h"

namespace kvengine {

// Reads one request the ordinary way, through its file; sets its status and bytes_read.
void ReadOne(ReadRequest* request);
// The first failed request's status, or OK.
Status FirstError(const ReadRequest* requests, size_t count);

}  // namespace kvengine

#endif  // KVENGINE_ENV_MULTI_READ_H_
