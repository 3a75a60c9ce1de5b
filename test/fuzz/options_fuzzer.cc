// Fuzz target: the parsers of user strings: Options::Set and ApplyEnvironment (through
// util/config_parse.h), and the peer lists of Options::peers and Options::listen.
//
// Input: a line "name=value" (the first '=' splits; a line without one is a value for
// the option whose index is its first byte).  Properties checked:
//   - Set and the environment variable KVENGINE_<NAME> accept the same values and set
//     them alike;
//   - what Options::ToString prints is accepted by Set and prints the same again;
//   - the config parsers keep their contracts (sizes round-trip, ratios in [0, 1]);
//   - an endpoint list that parses prints back to text that parses to the same list;
//   - namespace_arenas that parses cuts the tier into contiguous parts, the default
//     first, none empty, within memory_capacity_bytes, each namespace in one part.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "db/arena_layout.h"
#include "kvengine/options.h"
#include "kvengine/transport.h"
#include "test/fuzz/fuzz_check.h"
#include "util/config_parse.h"

namespace kvengine {
namespace {

std::string EnvironmentName(const std::string& option) {
  std::string name = "KVENGINE_";
  for (char c : option) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// Options as Set would build them from ToString's lines.
Options FromLines(const std::string& lines) {
  Options o;
  std::istringstream in(lines);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    Status s = o.Set(line.substr(0, eq), line.substr(eq + 1));
    FUZZ_CHECK(s.ok(), "ToString printed a line Set refuses: " + line + ": " + s.ToString());
  }
  return o;
}

void CheckArenaLayout(const Options& options) {
  if (!options.Validate().ok()) return;
  ArenaLayout layout;
  if (!ArenaLayout::Parse(options, &layout).ok()) return;
  uint64_t offset = 0;
  for (size_t i = 0; i < layout.part_count(); i++) {
    const ArenaLayout::Part& part = layout.part(i);
    FUZZ_CHECK(part.offset == offset && part.size > 0, "arena parts not contiguous");
    FUZZ_CHECK((i == 0) == part.namespaces.empty(), "the default part is not first");
    for (const std::string& name : part.namespaces) {
      FUZZ_CHECK(layout.PartOfName(name) == i, "namespace " + name + " not in its part");
    }
    offset += part.size;
  }
  FUZZ_CHECK(offset <= options.memory_capacity_bytes, "arena parts exceed the tier");
}

void FuzzOption(const std::string& name, const std::string& value) {
  Options by_set;
  const Status set = by_set.Set(name, value);
  by_set.Validate();  // any verdict; it must only not crash
  if (set.ok() && name == "namespace_arenas") CheckArenaLayout(by_set);
  const std::string printed = by_set.ToString();
  // ToString is one line per option: a string option holding a newline is printed as
  // it is, and does not read back.
  if (value.find('\n') == std::string::npos) {
    FUZZ_CHECK(FromLines(printed).ToString() == printed,
               "ToString does not round-trip:\n" + printed);
  }

  // setenv cannot hold a NUL, and ApplyEnvironment only knows the table's names.
  if (value.find('\0') != std::string::npos) return;
  const std::vector<std::string> names = Options::SettableNames();
  if (std::find(names.begin(), names.end(), name) == names.end()) return;
  const std::string var = EnvironmentName(name);
  setenv(var.c_str(), value.c_str(), 1);
  Options by_env;
  const Status env = by_env.ApplyEnvironment();
  unsetenv(var.c_str());
  FUZZ_CHECK(env.ok() == set.ok(), "Set says " + set.ToString() + ", the environment " +
                                       env.ToString() + " for " + name + "='" + value + "'");
  FUZZ_CHECK(by_env.ToString() == printed, "Set and the environment set different values");
}

void FuzzConfigParsers(const std::string& text) {
  uint64_t size = 0;
  if (ParseSize(text, &size).ok()) {
    uint64_t again = 0;
    FUZZ_CHECK(ParseSize(std::to_string(size), &again).ok() && again == size,
               "a parsed size does not parse back from its digits");
  }
  double ratio = 0;
  if (ParseRatio(text, &ratio).ok()) FUZZ_CHECK(ratio >= 0.0 && ratio <= 1.0, "ratio range");
  int64_t i = 0;
  uint64_t u = 0;
  if (ParseUInt(text, &u).ok() && ParseInt(text, &i).ok()) {
    FUZZ_CHECK(i >= 0 && static_cast<uint64_t>(i) == u, "ParseInt and ParseUInt disagree");
  }
  bool b = false;
  ParseBool(text, &b);
}

void FuzzEndpoints(const std::string& text) {
  std::vector<Endpoint> list;
  if (!Endpoint::ParseList(text, &list).ok()) return;
  std::string printed;
  for (const Endpoint& e : list) printed += (printed.empty() ? "" : ",") + e.ToString();
  std::vector<Endpoint> again;
  const Status s = Endpoint::ParseList(printed, &again);
  FUZZ_CHECK(s.ok() && again == list,
             "endpoints '" + text + "' print as '" + printed + "', which " +
                 (s.ok() ? "parses to other endpoints" : "does not parse: " + s.ToString()));
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The options come from the input alone, never from the fuzzer's own environment.
  for (const std::string& name : kvengine::Options::SettableNames()) {
    unsetenv(kvengine::EnvironmentName(name).c_str());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvengine;
  const std::string line(reinterpret_cast<const char*>(data), size);
  const size_t eq = line.find('=');
  std::string name, value;
  if (eq != std::string::npos) {
    name = line.substr(0, eq);
    value = line.substr(eq + 1);
  } else if (!line.empty()) {
    const std::vector<std::string> names = Options::SettableNames();
    name = names[static_cast<uint8_t>(line[0]) % names.size()];
    value = line.substr(1);
  }
  FuzzOption(name, value);
  FuzzConfigParsers(value);
  FuzzEndpoints(value);
  return 0;
}
