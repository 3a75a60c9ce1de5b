#include "tools/option_list.h"

#include <algorithm>

namespace kvengine {

Status SetOptionList(const std::string& list, Options* options) {
  size_t pos = 0;
  while (pos < list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument("--options item '" + item + "' lacks '='");
    }
    Status s = options->Set(item.substr(0, eq), item.substr(eq + 1));
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace kvengine
