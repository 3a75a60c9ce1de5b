#include "util/logging.h"

#include <sys/time.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <ctime>

namespace kvengine {

Logger::~Logger() {
  if (file_ != nullptr) std::fclose(file_);
}

Status Logger::Configure(const Options& options) {
  level_ = options.log_level;
  callback_ = options.log_callback;
  if (!options.log_file.empty() && !callback_) {
    FILE* f = std::fopen(options.log_file.c_str(), "a");
    if (f == nullptr) {
      return Status::IOError("cannot open log_file '" + options.log_file + "'",
                             std::strerror(errno));
    }
    if (file_ != nullptr) std::fclose(file_);
    file_ = f;
  }
  return Status::OK();
}

const char* Logger::LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kOff:
      return "OFF";
  }
  return "?";
}

void Logger::Write(LogLevel level, const std::string& line) {
  if (!Enabled(level)) return;
  MutexLock lock(&mu_);
  WriteLocked(level, line);
}

void Logger::WriteGroup(const std::vector<std::pair<LogLevel, std::string>>& lines) {
  MutexLock lock(&mu_);
  for (const auto& [level, line] : lines) {
    if (Enabled(level)) WriteLocked(level, line);
  }
}

void Logger::WriteLocked(LogLevel level, const std::string& line) {
  if (callback_) {
    callback_(level, line);
    return;
  }
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char stamp[96];
  std::snprintf(stamp, sizeof(stamp), "%04d/%02d/%02d-%02d:%02d:%02d.%06ld", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long>(tv.tv_usec));
  FILE* out = file_ != nullptr ? file_ : stderr;
  std::fprintf(out, "%s kvengine %s %s\n", stamp, LevelName(level), line.c_str());
  std::fflush(out);
}

void Logger::Logf(LogLevel level, const char* format, ...) {
  if (!Enabled(level)) return;
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  int n = std::vsnprintf(buf, sizeof(buf), format, ap);
  va_end(ap);
  if (n < 0) return;
  if (static_cast<size_t>(n) < sizeof(buf)) {
    Write(level, std::string(buf, n));
    return;
  }
  std::string big(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, format);
  std::vsnprintf(big.data(), big.size(), format, ap);
  va_end(ap);
  big.resize(static_cast<size_t>(n));
  Write(level, big);
}

}  // namespace kvengine
