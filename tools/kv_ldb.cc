// kv_ldb: kvengine's inspector, in the manner of RocksDB's ldb and sst_dump.
//
//   kv_ldb COMMAND --db=DIR [flags] [ARG]
//   kv_ldb help [COMMAND]
//
// Each command is a small class (tools/ldb_commands.h); the offline ones read the files
// through an offline model of the DB directory (tools/ldb_model.h).  docs/kv_ldb.md shows
// every command with example output.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tools/ldb_commands.h"

namespace {

using kvengine::ldb::AllCommands;
using kvengine::ldb::kExitOk;
using kvengine::ldb::kExitUsage;
using kvengine::ldb::LdbCommand;

std::string Usage() {
  std::string u =
      "inspects a kvengine DB directory (buckets, tombstones, keys).\n"
      "  kv_ldb COMMAND --db=DIR [flags] [ARG]      kv_ldb help [COMMAND]\n"
      "Offline commands read the files directly (they work on a damaged DB and never modify\n"
      "it) and take the DB's LOCK unless --read_only; stats, peers, compact and delete open the "
      "DB.\n"
      "Exit codes: 0 success, 1 failure (error, key not found, corruption), 2 usage error.\n"
      "Commands:\n";
  for (const auto& c : AllCommands()) {
    for (char ch : "  " + std::string(c->Help()) + "\n") {
      u.push_back(ch);
      if (ch == '\n') u += "    ";  // the help's lines under the command line
    }
    u.resize(u.size() - 4);
  }
  return u;
}

int PrintHelp(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::printf("kv_ldb: %sRun kv_ldb --help for every flag.\n", Usage().c_str());
    return kExitOk;
  }
  for (const auto& c : AllCommands()) {
    if (args[0] == c->Name()) {
      std::printf("%s\n", c->Help());
      return kExitOk;
    }
  }
  std::fprintf(stderr, "kv_ldb: unknown command '%s'; kv_ldb help lists them\n", args[0].c_str());
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(Usage());
  gflags::SetVersionString("0.1.0");
  // gflags moves the arguments that are not flags behind the flags: argv[1] is the command.
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  if (argc < 2) {
    std::fprintf(stderr, "kv_ldb: no command given; kv_ldb help lists the commands\n");
    return kExitUsage;
  }
  const std::string name = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "help") return PrintHelp(args);

  for (const auto& command : AllCommands()) {
    if (name != command->Name()) continue;
    if (args.size() > command->MaxArgs()) {
      std::fprintf(stderr, "kv_ldb %s: unexpected argument '%s' (flags look like --name=value)\n",
                   name.c_str(), args[command->MaxArgs()].c_str());
      return kExitUsage;
    }
    // A kv_ldb flag that this command does not read is a mistake worth reporting.
    std::vector<std::string> allowed = command->Flags();
    allowed.push_back("db");
    if (!command->Online()) allowed.push_back("read_only");
    for (const std::string& flag : kvengine::ldb::AllFlagNames()) {
      gflags::CommandLineFlagInfo info;
      if (!gflags::GetCommandLineFlagInfo(flag.c_str(), &info) || info.is_default) continue;
      bool ok = false;
      for (const std::string& a : allowed) ok = ok || a == flag;
      if (ok) continue;
      if (flag == "read_only") {
        std::fprintf(stderr,
                     "kv_ldb %s: --read_only is refused: %s opens the DB through DB::Open, "
                     "which recovers it and may rewrite the tombstone log\n",
                     name.c_str(), name.c_str());
      } else {
        std::fprintf(stderr, "kv_ldb %s: --%s does not apply to %s; kv_ldb help %s\n", name.c_str(),
                     flag.c_str(), name.c_str(), name.c_str());
      }
      return kExitUsage;
    }
    if (command->NeedsDb() && gflags::GetCommandLineFlagInfoOrDie("db").current_value.empty()) {
      std::fprintf(stderr, "kv_ldb %s: --db=DIR is required\n", name.c_str());
      return kExitUsage;
    }
    return command->DoCommand(args);
  }
  std::fprintf(stderr, "kv_ldb: unknown command '%s'; kv_ldb help lists the commands\n",
               name.c_str());
  return kExitUsage;
}
