// DBImpl, statistics: "kvengine.stats" as text and JSON, and StatsPrometheus, the DB's
// statistics and the perf histograms in the Prometheus text exposition format (version
// 0.0.4), for a serving process to publish unchanged.
//
// The figures are declared once, in db/db_stats.def (names, kinds, which outputs, the
// Prometheus HELP); each format below is a walk over that table.  Prometheus names follow
// its conventions: a kvengine_ prefix, _total for counters, _bytes / _seconds for units.
#include <cinttypes>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include "db/db_impl.h"
#include "util/prometheus.h"

namespace kvengine {

namespace {

// ---------------------------------------------------------------- the table

enum Kind { kCounter, kGauge };

// Where a figure is reported; see db/db_stats.def.
enum Output : unsigned {
  kText = 1u << 0,
  kJson = 1u << 1,
  kJsonAfterErrors = 1u << 2,
  kProm = 1u << 3,
  kPromAfterNext = 1u << 4,
};

// A figure's value: a count, a flag or a ratio.
class Value {
 public:
  constexpr explicit Value(uint64_t n) : type_(kCount), count_(n) {}
  constexpr explicit Value(bool flag) : type_(kFlag), count_(flag ? 1 : 0) {}
  constexpr explicit Value(double ratio) : type_(kRatio), ratio_(ratio) {}

  // As the text and the JSON print it: 12, true, 0.272727 (the stream's defaults).
  friend std::ostream& operator<<(std::ostream& out, const Value& v) {
    switch (v.type_) {
      case kCount:
        return out << v.count_;
      case kFlag:
        return out << (v.count_ != 0 ? "true" : "false");
      case kRatio:
        return out << v.ratio_;
    }
    return out;
  }
  // As a Prometheus sample.
  double AsDouble() const { return type_ == kRatio ? ratio_ : static_cast<double>(count_); }

 private:
  enum Type { kCount, kFlag, kRatio };
  Type type_;
  uint64_t count_ = 0;
  double ratio_ = 0;
};

// The values of DBImpl::Counters, loaded once per call.  A KV_COUNTER of group memory
// or ssd must be named group_name.
constexpr bool NamedForGroup(std::string_view group, std::string_view field) {
  return group == "db" || (field.size() > group.size() + 1 && field.starts_with(group) &&
                           field[group.size()] == '_');
}
struct CounterValues {
#define KV_COUNTER(group, field, kind, outputs, help) \
  uint64_t field = 0;                                 \
  static_assert(NamedForGroup(#group, #field), #field ": not named " #group "_<name>");
#include "db/db_stats.def"
};
// `C` is DBImpl::Counters (private to DBImpl, so deduced here rather than named).
template <typename C>
CounterValues LoadCounters(const C& counters) {
  CounterValues v;
#define KV_COUNTER(group, field, kind, outputs, help) \
  v.field = counters.field.load(std::memory_order_relaxed);
#include "db/db_stats.def"
  return v;
}

// What the rows read their values from, taken once per call.
struct Sources {
  MemoryTier::Stats memory;
  bool has_ssd;        // the DB has an SSD tier
  SsdTier::Stats ssd;  // zeros without it
  CounterValues counters;
  AllTierValues tiers;
};

// Figures read from the per-tier counters (KV_FROM_TIERS).
uint64_t MemoryHits(const AllTierValues& t) { return t.memory.hits; }
uint64_t SsdHits(const AllTierValues& t) { return t.ssd.hits; }
uint64_t Promotions(const AllTierValues& t) { return t.ssd.promotions + t.peer.promotions; }

// Derived figures (KV_DERIVED).
uint64_t IndexBytesPerKey(const MemoryTier::Stats& m) {
  return m.items == 0 ? 0 : m.index_bytes / m.items;
}
uint64_t IndexBytesPerKey(const SsdTier::Stats& d) {
  return d.keys == 0 ? 0 : d.index_bytes / d.keys;
}
double DeletedRatio(const SsdTier::Stats& d) {
  return d.live_bytes + d.deleted_bytes == 0
             ? 0.0
             : static_cast<double>(d.deleted_bytes) /
                   static_cast<double>(d.live_bytes + d.deleted_bytes);
}

// Whether the rows of `group` read from the SSD tier (KV_STAT, KV_DERIVED).
constexpr bool FromSsdTier(std::string_view group) { return group == "ssd"; }

// A counter's name in its group: memory_hits in group memory is "hits".
constexpr std::string_view CounterName(std::string_view group, std::string_view field) {
  return group == "db" ? field : field.substr(group.size() + 1);
}

// One line of db/db_stats.def.
struct Row {
  std::string_view group;  // "memory", "db" or "ssd"
  std::string_view name;   // within the group
  Kind kind;
  unsigned outputs;  // Output bits
  const char* help;
  bool ssd_tier;  // its value comes from the SSD tier: reported only with it
  Value (*value)(const Sources& s);

  bool ReportedIn(const Sources& s) const { return !ssd_tier || s.has_ssd; }
};

// The value of a row: `expr`, of Sources `s`.
#define KV_VALUE(expr) [](const Sources& s) { return Value(expr); }
constexpr Row kRows[] = {
#define KV_STAT(group, name, kind, outputs, help) \
  {#group, #name, kind, outputs, help, FromSsdTier(#group), KV_VALUE(s.group.name)},
#define KV_COUNTER(group, field, kind, outputs, help) \
  {#group, CounterName(#group, #field), kind, outputs, help, false, KV_VALUE(s.counters.field)},
#define KV_DERIVED(group, name, function, kind, outputs, help) \
  {#group, #name, kind, outputs, help, FromSsdTier(#group), KV_VALUE(function(s.group))},
#define KV_FROM_TIERS(group, name, function, kind, outputs, help) \
  {#group, #name, kind, outputs, help, false, KV_VALUE(function(s.tiers))},
#include "db/db_stats.def"
};

// One KV_TIER_SAMPLE line: a sample of a family labelled by tier.
struct TierSample {
  const char* family;  // kvengine_<family>[_total]
  Kind kind;
  const char* tier;
  const char* label;  // "" or `reason="..."`
  const char* help;   // "" but on a family's first line
  Value (*value)(const Sources& s);
};
constexpr TierSample kTierSamples[] = {
#define KV_TIER_SAMPLE(family, kind, tier, label, value, help) \
  {#family, kind, #tier, label, help, KV_VALUE(uint64_t{value})},
#include "db/db_stats.def"
};
#undef KV_VALUE

// "memory" + "hits" joined by `sep` ("memory.hits", "memory_hits"); db's have no prefix.
std::string Spelled(const Row& row, char sep) {
  std::string out;
  if (row.group != "db") {
    out += row.group;
    out += sep;
  }
  out += row.name;
  return out;
}

// "kvengine.stats": the "name: value" lines of the rows of the SSD tier, or of the others.
void AppendText(const Sources& s, bool ssd_tier, std::ostringstream* out) {
  for (const Row& row : kRows) {
    if ((row.outputs & kText) == 0 || row.ssd_tier != ssd_tier || !row.ReportedIn(s)) continue;
    *out << Spelled(row, '.') << ": " << row.value(s) << "\n";
  }
}

// The JSON members `"name":value` of the rows with `output` (and of `group`, unless
// null), each after a comma but the first when `first` is set.  Top-level members of
// other groups than db are named group_name.
void AppendJson(const Sources& s, const char* group, Output output, bool first,
                std::ostringstream* out) {
  for (const Row& row : kRows) {
    if ((row.outputs & output) == 0 || (group != nullptr && row.group != group)) continue;
    if (!row.ReportedIn(s)) continue;
    if (!first) *out << ",";
    first = false;
    const bool nested = output == kJson && row.group != "db";
    *out << "\"" << (nested ? std::string(row.name) : Spelled(row, '_')) << "\":" << row.value(s);
  }
}

// ---------------------------------------------------------------- Prometheus

const char* TypeName(Kind kind) { return kind == kCounter ? "counter" : "gauge"; }

// The row's own family: kvengine_[group_]name[_total].
void AppendFamily(const Sources& s, const Row& row, Exposition* e) {
  const std::string name = "kvengine_" + Spelled(row, '_') + (row.kind == kCounter ? "_total" : "");
  e->Header(name, TypeName(row.kind), row.help);
  e->Sample(name, "", row.value(s).AsDouble());
}

// The families of `group`'s rows, in table order but for kPromAfterNext.
void AppendFamilies(const Sources& s, std::string_view group, Exposition* e) {
  const Row* held = nullptr;  // a kPromAfterNext row, waiting for the next family
  for (const Row& row : kRows) {
    if ((row.outputs & (kProm | kPromAfterNext)) == 0 || row.group != group) continue;
    if (!row.ReportedIn(s)) continue;
    if ((row.outputs & kPromAfterNext) != 0 && held == nullptr) {
      held = &row;
      continue;
    }
    AppendFamily(s, row, e);
    if (held != nullptr) AppendFamily(s, *held, e);
    held = nullptr;
  }
  if (held != nullptr) AppendFamily(s, *held, e);
}

// The labelled families of the KV_TIER_SAMPLE lines, each family's lines together.
void AppendTierFamilies(const Sources& s, Exposition* e) {
  std::string_view family;
  std::string name;
  for (const TierSample& t : kTierSamples) {
    if (family != t.family) {
      family = t.family;
      name = "kvengine_" + std::string(family) + (t.kind == kCounter ? "_total" : "");
      e->Header(name, TypeName(t.kind), t.help);
    }
    std::string labels = std::string("{tier=\"") + t.tier + "\"";
    if (*t.label != '\0') labels += std::string(",") + t.label;
    e->Sample(name, labels + "}", t.value(s).AsDouble());
  }
}

// `C` is DBImpl::Counters.
template <typename C>
Sources Collect(const MemoryTier& memory, const SsdTier* ssd, const C& counters,
                const AllTierCounters& tiers) {
  return Sources{memory.GetStats(), ssd != nullptr,
                 ssd != nullptr ? ssd->GetStats() : SsdTier::Stats(), LoadCounters(counters),
                 AllTierValues::Of(tiers)};
}

// ---------------------------------------------------------------- namespaces

// One per-namespace figure: its name, kind, help and where a Report keeps it.
struct NamespaceFigure {
  const char* name;
  Kind kind;
  const char* help;
  uint64_t (*value)(const NamespaceUsage::Report& r);
};

const NamespaceFigure kNamespaceFigures[] = {
    {"memory_quota_bytes", kGauge, "The namespace's memory tier quota (0: none).",
     [](const NamespaceUsage::Report& r) { return r.memory_quota_bytes; }},
    {"ssd_quota_bytes", kGauge, "The namespace's SSD tier quota (0: none).",
     [](const NamespaceUsage::Report& r) { return r.ssd_quota_bytes; }},
    {"weight", kGauge, "The namespace's weight in the tiers' fair shares.",
     [](const NamespaceUsage::Report& r) { return uint64_t{r.weight}; }},
#define KV_NS_GAUGE_ROW(field, help) \
  {#field, kGauge, help, [](const NamespaceUsage::Report& r) { return r.field; }},
#define KV_NS_COUNTER_ROW(field, help) \
  {#field, kCounter, help, [](const NamespaceUsage::Report& r) { return r.field; }},
    KV_NAMESPACE_FIGURES(KV_NS_GAUGE_ROW, KV_NS_COUNTER_ROW)
#undef KV_NS_GAUGE_ROW
#undef KV_NS_COUNTER_ROW
};

// "namespace.NAME.figure: value" lines.
void AppendNamespaceText(const std::vector<NamespaceUsage::Report>& reports,
                         std::ostringstream* out) {
  for (const NamespaceUsage::Report& r : reports) {
    for (const NamespaceFigure& f : kNamespaceFigures) {
      *out << "namespace." << r.name << "." << f.name << ": " << f.value(r) << "\n";
    }
  }
}

// `,"namespaces":{"NAME":{"figure":value,...},...}`; nothing without namespaces.
void AppendNamespaceJson(const std::vector<NamespaceUsage::Report>& reports,
                         std::ostringstream* out) {
  if (reports.empty()) return;
  *out << ",\"namespaces\":{";
  for (size_t i = 0; i < reports.size(); i++) {
    *out << (i == 0 ? "" : ",") << "\"" << reports[i].name << "\":{";
    for (size_t j = 0; j < std::size(kNamespaceFigures); j++) {
      const NamespaceFigure& f = kNamespaceFigures[j];
      *out << (j == 0 ? "" : ",") << "\"" << f.name << "\":" << f.value(reports[i]);
    }
    *out << "}";
  }
  *out << "}";
}

// kvengine_namespace_figure[_total]{namespace="NAME"}, a family per figure.
void AppendNamespaceFamilies(const std::vector<NamespaceUsage::Report>& reports, Exposition* e) {
  if (reports.empty()) return;
  for (const NamespaceFigure& f : kNamespaceFigures) {
    const std::string name =
        std::string("kvengine_namespace_") + f.name + (f.kind == kCounter ? "_total" : "");
    e->Header(name, TypeName(f.kind), f.help);
    for (const NamespaceUsage::Report& r : reports) {
      e->Sample(name, "{namespace=\"" + r.name + "\"}", static_cast<double>(f.value(r)));
    }
  }
}

}  // namespace

std::string DBImpl::StatsPrometheus() const {
  const Sources s = Collect(*memory_, ssd_.get(), counters_, tiers_);
  Exposition e;
  AppendFamilies(s, "memory", &e);
  AppendTierFamilies(s, &e);
  AppendFamilies(s, "db", &e);
  AppendFamilies(s, "ssd", &e);

  e.Header("kvengine_errors_total", "counter", "Failed keys and calls, by kind of error.");
  for (int c = 1; c < ErrorCounters::kNumCodes; c++) {
    const auto code = static_cast<Status::Code>(c);
    e.Sample("kvengine_errors_total", std::string("{kind=\"") + Status::CodeName(code) + "\"}",
             static_cast<double>(errors_.Get(code)));
  }
  AppendNamespaceFamilies(namespace_usage_->Reports(), &e);

  AppendPerfFamilies(&e);
  return e.Take();
}

std::string DBImpl::StatsText() const {
  const Sources s = Collect(*memory_, ssd_.get(), counters_, tiers_);
  std::ostringstream out;
  out << "** kvengine stats **\n";
  AppendText(s, /*ssd_tier=*/false, &out);
  out << errors_.ToText();
  AppendText(s, /*ssd_tier=*/true, &out);
  AppendNamespaceText(namespace_usage_->Reports(), &out);
  return out.str();
}

std::string DBImpl::StatsJson() const {
  const Sources s = Collect(*memory_, ssd_.get(), counters_, tiers_);
  std::ostringstream out;
  out << "{\"memory\":{";
  AppendJson(s, "memory", kJson, /*first=*/true, &out);
  out << "}";
  AppendJson(s, "db", kJson, /*first=*/false, &out);
  out << ",\"errors\":" << errors_.ToJson();
  AppendJson(s, nullptr, kJsonAfterErrors, /*first=*/false, &out);
  if (s.has_ssd) {
    out << ",\"ssd\":{";
    AppendJson(s, "ssd", kJson, /*first=*/true, &out);
    out << "}";
  }
  AppendNamespaceJson(namespace_usage_->Reports(), &out);
  out << "}";
  return out.str();
}

}  // namespace kvengine
