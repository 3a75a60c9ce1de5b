// _kvengine.LoadPlanner: include/kvengine/load_planner.h for Python.
//
// Bad options, requests and measurements raise ValueError with the planner's message
// (it names the option or the argument), and change nothing.  The calls are arithmetic
// under one short lock: they keep the GIL.
#include "python/src/load_planner_binding.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvengine/load_planner.h"

namespace py = pybind11;

namespace kvengine {
namespace python {
namespace {

void Check(const Status& s) {
  if (!s.ok()) throw py::value_error(s.ToString());
}

// The one-time notice of an unknown prefill rate, on Python's "kvengine" logger.
void LogWarning(const std::string& line) {
  py::gil_scoped_acquire gil;
  py::module_::import("logging").attr("getLogger")("kvengine").attr("warning")(line);
}

py::dict PlanDict(const LoadPlan& p) {
  py::dict d;
  d["hit_blocks"] = p.hit_blocks;
  d["load_blocks"] = p.load_blocks;
  d["rate_known"] = p.rate_known;
  d["load_s"] = p.load_s;
  d["recompute_s"] = p.recompute_s;
  d["all_hits_load_s"] = p.all_hits_load_s;
  d["all_hits_recompute_s"] = p.all_hits_recompute_s;
  d["planned_ttft_s"] = p.planned_ttft_s;
  d["all_hits_ttft_s"] = p.all_hits_ttft_s;
  return d;
}

std::unique_ptr<LoadPlanner> MakePlanner(std::optional<double> rate, double memory_bytes_per_s,
                                         double memory_latency_s, double ssd_bytes_per_s,
                                         double ssd_latency_s, double peer_bytes_per_s,
                                         double peer_latency_s, uint32_t overlap_layers,
                                         double estimate_weight, double margin,
                                         uint64_t memory_samples, uint64_t ssd_samples,
                                         uint64_t peer_samples) {
  LoadPlannerOptions o;
  o.recompute_tokens_per_s = rate;
  o.memory = {memory_bytes_per_s, memory_latency_s, memory_samples};
  o.ssd = {ssd_bytes_per_s, ssd_latency_s, ssd_samples};
  o.peer = {peer_bytes_per_s, peer_latency_s, peer_samples};
  o.overlap_layers = overlap_layers;
  o.estimate_weight = estimate_weight;
  o.margin = margin;
  o.info_log = LogWarning;
  std::unique_ptr<LoadPlanner> planner;
  Check(LoadPlanner::Create(o, &planner));
  return planner;
}

}  // namespace

void BindLoadPlanner(py::module_& m) {
  const LoadPlannerOptions d;
  py::class_<LoadPlanner>(m, "LoadPlanner",
                          "How many leading hit blocks of a request to load so that loading "
                          "them is no slower than computing them (docs/python.md).")
      .def(py::init(&MakePlanner), py::arg("recompute_tokens_per_s") = py::none(),
           py::arg("memory_bytes_per_s") = d.memory.bytes_per_s,
           py::arg("memory_latency_s") = d.memory.latency_s,
           py::arg("ssd_bytes_per_s") = d.ssd.bytes_per_s,
           py::arg("ssd_latency_s") = d.ssd.latency_s,
           py::arg("peer_bytes_per_s") = d.peer.bytes_per_s,
           py::arg("peer_latency_s") = d.peer.latency_s,
           py::arg("overlap_layers") = d.overlap_layers,
           py::arg("estimate_weight") = d.estimate_weight, py::arg("margin") = d.margin,
           py::arg("memory_samples") = d.memory.samples, py::arg("ssd_samples") = d.ssd.samples,
           py::arg("peer_samples") = d.peer.samples)
      .def(
          "plan",
          [](LoadPlanner& p, const std::vector<int64_t>& key_tiers, uint64_t keys_per_block,
             uint64_t key_bytes, uint64_t block_tokens, uint64_t request_tokens) {
            const LoadPlanRequest r{.key_tiers = key_tiers,
                                    .keys_per_block = keys_per_block,
                                    .key_bytes = key_bytes,
                                    .block_tokens = block_tokens,
                                    .request_tokens = request_tokens};
            LoadPlan plan;
            Check(p.Plan(r, &plan));
            return PlanDict(plan);
          },
          py::arg("key_tiers"), py::arg("keys_per_block"), py::arg("key_bytes"),
          py::arg("block_tokens"), py::arg("request_tokens") = 0,
          "key_tiers: batch_locate's answers for the hit blocks' keys, block after block. "
          "Returns a dict: load_blocks (the leading blocks to load), hit_blocks, rate_known, "
          "and the estimates that decided it (seconds).")
      .def(
          "record_load",
          [](LoadPlanner& p, uint64_t memory_bytes, uint64_t ssd_bytes, uint64_t peer_bytes,
             double seconds) { Check(p.RecordLoad(memory_bytes, ssd_bytes, peer_bytes, seconds)); },
          py::arg("memory_bytes"), py::arg("ssd_bytes"), py::arg("peer_bytes"), py::arg("seconds"))
      .def(
          "record_prefill",
          [](LoadPlanner& p, uint64_t tokens, double seconds) {
            Check(p.RecordPrefill(tokens, seconds));
          },
          py::arg("tokens"), py::arg("seconds"))
      .def(
          "add_in_flight",
          [](LoadPlanner& p, int64_t tier, uint64_t bytes) { Check(p.AddInFlight(tier, bytes)); },
          py::arg("tier"), py::arg("bytes"))
      .def(
          "estimate",
          [](LoadPlanner& p, int64_t tier) {
            const TierReadEstimate e = p.Estimate(tier);
            py::dict out;
            out["bytes_per_s"] = e.bytes_per_s;
            out["latency_s"] = e.latency_s;
            out["samples"] = e.samples;
            return out;
          },
          py::arg("tier"))
      .def_readonly_static("TRUSTED_LOADS", &LoadPlanner::kTrustedLoads)
      .def_property_readonly("recompute_tokens_per_s", [](LoadPlanner& p) {
        const double rate = p.RecomputeTokensPerSecond();
        return rate > 0 ? py::object(py::float_(rate)) : py::object(py::none());
      });
}

}  // namespace python
}  // namespace kvengine
