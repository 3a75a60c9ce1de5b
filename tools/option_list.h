// The tools' --options=name=value,... flag: a comma-separated list of Options::Set calls.
#ifndef KVENGINE_TOOLS_OPTION_LIST_H_
#define KVENGINE_TOOLS_OPTION_LIST_H_

#include <string>

#include "kvengine/options.h"

namespace kvengine {

// Applies each "name=value" item of `list` (comma-separated; empty items are skipped) to
// *options in order.  Stops at the first bad item and returns InvalidArgument naming it
// (an item without '=', or what Options::Set says); the items before it stay applied.
Status SetOptionList(const std::string& list, Options* options);

}  // namespace kvengine

#endif  // KVENGINE_TOOLS_OPTION_LIST_H_
