// recorder-bench: what the flight recorder adds to a step, measured on the host alone (issue 49).
// A step of DDP issues one all-reduce per gradient bucket and waits for them in issue order; the
// recorder's part of that is FlightRing::record at each issue and FlightRing::end at each wait.
// For every zoo model this runs exactly those calls for its bucket count (PlanOptions' default
// caps, fp32 gradients) on a ring of 4096 entries and on a ring of none (the recorder off: the
// numbering alone), many steps each, and prints the microseconds a step that the recorder adds.
// Against a GPU step time it bounds the recorder's share of the step far below what ddp-bench
// pairs can resolve (their spread is several percent on steps of a few milliseconds).
//
//   recorder-bench [--steps N] [--models a,b,...]

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/flag_parse.hpp"
#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/recorder/flight_ring.hpp"
#include "ddp/models/registry.hpp"

namespace {

using Clock = std::chrono::steady_clock;

size_t bucket_count(const std::string& model) {
  const ddp::models::Workload w = ddp::models::make_workload(model);
  std::vector<ddp::buckets::ParamSpec> specs;
  for (const auto& p : w.ptr->named_parameters()) {
    specs.push_back({p.key(), p.value().numel(), p.value().scalar_type(), p.value().device()});
  }
  return ddp::buckets::plan_buckets(specs, {}).buckets.size();
}

// Microseconds a step of `collectives` record / end pairs takes on a ring of `capacity`, the best
// of 5 runs of `steps` steps (the least disturbed by this machine's other work).
double step_us(int64_t capacity, size_t collectives, int steps) {
  ddp::comm::FlightRing ring("bench", 0, {0, 1}, capacity);
  // Distinct identities, as distinct c10d works are; never dereferenced.
  std::vector<char> works(collectives);
  const ddp::comm::CollectiveOp op{"all-reduce coalesced (average)", 6553600, c10::kFloat, -1};
  double best = 1e300;
  for (int run = 0; run < 5; ++run) {
    const auto start = Clock::now();
    for (int s = 0; s < steps; ++s) {
      for (size_t b = 0; b < collectives; ++b) ring.record(&works[b], op);
      for (size_t b = 0; b < collectives; ++b) {
        ring.end(&works[b], ddp::comm::FlightState::kCompleted);
      }
    }
    const std::chrono::duration<double, std::micro> took = Clock::now() - start;
    best = std::min(best, took.count() / steps);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The flight recorder's host cost a DDP step, per zoo model"};
  int steps = 20000;
  std::string models;
  app.add_option("--steps", steps, "steps a timed run (default 20000)")->check(CLI::PositiveNumber);
  app.add_option("--models", models,
                 "comma-separated zoo models (default: all but the Llama 3 rows)");
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "recorder-bench"); code >= 0) {
    return code;
  }

  std::vector<std::string> names;
  if (models.empty()) {
    // Not the Llama 3 rows: each takes 5 to 32 GB to build, for a bucket count.
    for (const auto& name : ddp::models::workload_names()) {
      if (name != "llama-1b" && name != "llama-3b" && name != "llama-8b") names.push_back(name);
    }
  } else {
    std::stringstream list(models);
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  }
  std::printf("%-13s %8s %10s %10s %10s\n", "model", "buckets", "off us", "on us", "added us");
  for (const std::string& name : names) {
    const size_t buckets = bucket_count(name);
    const double off = step_us(0, buckets, steps);
    const double on = step_us(4096, buckets, steps);
    std::printf("%-13s %8zu %10.3f %10.3f %10.3f\n", name.c_str(), buckets, off, on, on - off);
  }
  return 0;
}
