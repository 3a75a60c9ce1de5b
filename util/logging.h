// Logger: the DB's log sink (stderr, a file or an embedder's callback) with a level.
//
// Callers check Enabled(level) before formatting anything, so a disabled level costs one
// comparison and no string work.  Thread-safe.
#ifndef KVENGINE_UTIL_LOGGING_H_
#define KVENGINE_UTIL_LOGGING_H_

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kvengine/options.h"
#include "util/mutex.h"

namespace kvengine {

class Logger {
 public:
  using Callback = std::function<void(LogLevel, const std::string&)>;

  // Writes to stderr at level kWarn.
  Logger() = default;
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Configures from options: level, file or callback.  Fails when the file cannot be
  // opened for appending.
  Status Configure(const Options& options);

  bool Enabled(LogLevel level) const { return level >= level_ && level_ != LogLevel::kOff; }
  void Write(LogLevel level, const std::string& line);
  // Writes the enabled lines of `lines` in order, with no line of another writer in
  // between (the structured log of one call).  The sink (callback included) is called
  // under the logger's lock, so a callback must not log through this Logger.
  void WriteGroup(const std::vector<std::pair<LogLevel, std::string>>& lines);
  // printf-style; formats only when the level is enabled.
  void Logf(LogLevel level, const char* format, ...) __attribute__((format(printf, 3, 4)));

  static const char* LevelName(LogLevel level);

 private:
  void WriteLocked(LogLevel level, const std::string& line) REQUIRES(mu_);

  LogLevel level_ = LogLevel::kWarn;
  Callback callback_;
  Mutex mu_;
  FILE* file_ = nullptr;  // owned when not stderr
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_LOGGING_H_
