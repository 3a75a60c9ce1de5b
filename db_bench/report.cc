#include "db_bench/report.h"

#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace kvbench {

std::string Printf(const char* fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  char buf[512];
  const int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::string out;
  if (n >= 0 && static_cast<size_t>(n) < sizeof(buf)) {
    out = buf;
  } else if (n >= 0) {
    out.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data(), out.size(), fmt, again);
    out.resize(static_cast<size_t>(n));
  }
  va_end(again);
  return out;
}

namespace {

// JSON has no NaN or infinity.
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return Printf("%.6g", v);
}

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += Printf("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string FormatLine(const Result& r) {
  std::string extra;
  if (r.bytes > 0) extra = Printf("%6.1f MB/s", r.MBPerSec());
  std::string msg;
  if (r.counts_found) {
    msg += Printf("(%" PRIu64 " of %" PRIu64 " found)", r.found, r.lookups);
  }
  if (r.baseline_ratio > 0) {
    msg +=
        (msg.empty() ? "" : " ") + Printf("(%.2fx %s)", r.baseline_ratio, r.baseline_name.c_str());
  }
  if (r.reports_latency) {
    msg += (msg.empty() ? "" : " ") +
           Printf("(P50 %.1f P99 %.1f micros/call)", r.hist.Percentile(50), r.hist.Percentile(99));
  }
  if (r.reports_reclaimed) {
    msg += msg.empty() ? "" : " ";
    msg += r.reclaimed_bytes ? Printf("(%" PRIu64 " bytes reclaimed)", *r.reclaimed_bytes)
                             : std::string("(bytes reclaimed n/a)");
  }
  if (!r.note.empty()) msg += (msg.empty() ? "(" : " (") + r.note + ")";
  if (r.errors > 0) msg += Printf(" [%" PRIu64 " ERRORS]", r.errors);
  if (!msg.empty()) extra += (extra.empty() ? "" : " ") + msg;
  return Printf("%-12s : %11.3f micros/op %ld ops/sec %.3f seconds %" PRIu64 " operations;",
                r.label.c_str(), r.MicrosPerOp(), static_cast<long>(r.OpsPerSec()), r.seconds,
                r.ops) +
         (extra.empty() ? "" : " ") + extra;
}

std::string FormatJson(const Result& r, bool with_histogram) {
  std::string j = "{\"benchmark\":\"" + JsonEscape(r.benchmark) + "\",\"engine\":" +
                  (r.engine.empty() ? std::string("null") : "\"" + r.engine + "\"");
  j += ",\"micros_per_op\":" + Num(r.MicrosPerOp());
  j += ",\"ops_per_sec\":" + Num(r.OpsPerSec());
  j += ",\"seconds\":" + Num(r.seconds);
  j += ",\"wall_seconds\":" + Num(r.wall_seconds);
  if (r.cpu_seconds > 0) j += ",\"cpu_seconds\":" + Num(r.cpu_seconds);
  j += Printf(",\"operations\":%" PRIu64 ",\"keys\":%" PRIu64 ",\"bytes\":%" PRIu64, r.ops, r.keys,
              r.bytes);
  j += ",\"mb_per_sec\":" + Num(r.MBPerSec());
  j += Printf(",\"threads\":%" PRIu64, r.threads);
  if (r.counts_found)
    j += Printf(",\"lookups\":%" PRIu64 ",\"found\":%" PRIu64, r.lookups, r.found);
  j += Printf(",\"verified\":%" PRIu64 ",\"errors\":%" PRIu64, r.verified, r.errors);
  if (!r.first_error.empty()) j += ",\"first_error\":\"" + JsonEscape(r.first_error) + "\"";
  if (r.baseline_ratio > 0) {
    j += ",\"vs_" + r.baseline_name + "\":" + Num(r.baseline_ratio);
  }
  if (r.reports_reclaimed) {
    j += ",\"reclaimed_bytes\":" +
         (r.reclaimed_bytes ? std::to_string(*r.reclaimed_bytes) : std::string("null"));
  }
  if (!r.note.empty()) j += ",\"note\":\"" + JsonEscape(r.note) + "\"";
  if (with_histogram || r.reports_reclaimed || r.reports_latency) {
    j += ",\"latency_us\":{\"count\":" + std::to_string(r.hist.count()) +
         ",\"average\":" + Num(r.hist.Average()) + ",\"min\":" + Num(r.hist.min()) +
         ",\"p50\":" + Num(r.hist.Percentile(50)) + ",\"p75\":" + Num(r.hist.Percentile(75)) +
         ",\"p90\":" + Num(r.hist.Percentile(90)) + ",\"p99\":" + Num(r.hist.Percentile(99)) +
         ",\"p99.9\":" + Num(r.hist.Percentile(99.9)) +
         ",\"p99.99\":" + Num(r.hist.Percentile(99.99)) + ",\"max\":" + Num(r.hist.max()) + "}";
  }
  if (!r.statistics.empty()) j += ",\"statistics\":\"" + JsonEscape(r.statistics) + "\"";
  if (!r.index_report.empty()) {
    j += ",\"index_report\":\"" + JsonEscape(r.index_report) + "\"";
  }
  if (!r.detail_json.empty()) j += "," + r.detail_json;
  return j + "}";
}

double EngineRatio(const Result& a, const Result& b) {
  return b.OpsPerSec() > 0 ? a.OpsPerSec() / b.OpsPerSec() : 0;
}

double EngineCpuRatio(const Result& a, const Result& b) {
  return a.OpsPerCpuSecond() > 0 && b.OpsPerCpuSecond() > 0
             ? a.OpsPerCpuSecond() / b.OpsPerCpuSecond()
             : 0;
}

std::string FormatRatioLine(const Result& a, const Result& b) {
  std::string line =
      Printf("%-12s : %s/%s %.2fx ops/sec (%.1f vs %.1f)", a.benchmark.c_str(), a.engine.c_str(),
             b.engine.c_str(), EngineRatio(a, b), a.OpsPerSec(), b.OpsPerSec());
  const double cpu = EngineCpuRatio(a, b);
  if (cpu > 0) line += Printf(", %.2fx ops per CPU second", cpu);
  return line;
}

std::string FormatRatioJson(const Result& a, const Result& b) {
  return "{\"benchmark\":\"" + JsonEscape(a.benchmark) + "\",\"engine\":\"both\"" + ",\"ratio_" +
         a.engine + "_over_" + b.engine + "\":" + Num(EngineRatio(a, b)) + ",\"" + a.engine +
         "_ops_per_sec\":" + Num(a.OpsPerSec()) + ",\"" + b.engine +
         "_ops_per_sec\":" + Num(b.OpsPerSec()) +
         (EngineCpuRatio(a, b) > 0
              ? ",\"cpu_ratio_" + a.engine + "_over_" + b.engine + "\":" + Num(EngineCpuRatio(a, b))
              : std::string()) +
         "}";
}

}  // namespace kvbench
