// kv_ldb's commands, one small class each (RocksDB ldb's shape: Name, Help, DoCommand).
//
// Offline commands (list_buckets, dump_bucket, scan, get, tombstones, verify) read the
// files directly through tools/ldb_model.h and never modify the DB; they take the DB's
// LOCK unless --read_only.  Online commands (stats, compact, delete) open the DB with
// DB::Open, which recovers it (and may rewrite the tombstone log), so they refuse
// --read_only.
#ifndef KVENGINE_TOOLS_LDB_COMMANDS_H_
#define KVENGINE_TOOLS_LDB_COMMANDS_H_

#include <memory>
#include <string>
#include <vector>

namespace kvengine {
namespace ldb {

// Exit codes of kv_ldb.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // an error, a missing key, corruption found
inline constexpr int kExitUsage = 2;    // bad command, flag or argument

class LdbCommand {
 public:
  virtual ~LdbCommand() = default;
  virtual const char* Name() const = 0;
  // Usage line(s) and what the command does, for `kv_ldb help`.
  virtual const char* Help() const = 0;
  // The kv_ldb flags this command reads (besides --db and --read_only); setting any
  // other kv_ldb flag is a usage error.
  virtual std::vector<std::string> Flags() const { return {}; }
  // Most positional arguments after the command name.
  virtual size_t MaxArgs() const { return 0; }
  // Whether --db is required (dump_bucket --file works without one).
  virtual bool NeedsDb() const { return true; }
  // Whether the command opens the DB through DB::Open (and so refuses --read_only).
  virtual bool Online() const { return false; }
  // Runs the command; returns the exit code.  Writes results to stdout and problems to
  // stderr.
  virtual int DoCommand(const std::vector<std::string>& args) = 0;
};

// explain (tools/ldb_explain.cc): summarises a file of per-request accounts.
std::unique_ptr<LdbCommand> NewExplainCommand();

// Every command, in the order `kv_ldb help` lists them.
std::vector<std::unique_ptr<LdbCommand>> AllCommands();

// The names of every kv_ldb flag (not gflags' own).
std::vector<std::string> AllFlagNames();

}  // namespace ldb
}  // namespace kvengine

#endif  // KVENGINE_TOOLS_LDB_COMMANDS_H_
