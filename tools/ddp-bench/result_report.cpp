#include "result_report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>

#include "common/json_stdout.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/obs/runtime_stats.hpp"

namespace ddp::tools::bench {
namespace {

struct Stats {
  double median = 0, mean = 0, min = 0;
};

Stats summarize(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  s.median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  s.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(n);
  s.min = ms.front();
  return s;
}

// The memory plan made before the wrap (parallel/memory_estimate.hpp), one object a style.
nlohmann::ordered_json estimate_json(const ddp::tools::TrainingRun& run) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& e : run.memory_estimates()) {
    out[ddp::shard::style_name(e.style)] = {{"param_bytes", e.params},
                                            {"grad_bytes", e.grads},
                                            {"optimizer_state_bytes", e.optimizer_state},
                                            {"gathered_bytes", e.gathered},
                                            {"activation_bytes", e.activations}};
  }
  return out;
}

}  // namespace

Memory measure_memory(ddp::tools::TrainingRun& run, const ddp::obs::StepMemory& phases) {
  Memory m;
  for (const auto& p : run.params()) {
    m.params += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) m.grads += static_cast<int64_t>(p.grad().nbytes());
  }
  if (torch::optim::Optimizer* opt = run.optimizer()) {
    for (const auto& [key, t] : ddp::io::optimizer_tensors(*opt, *run.workload().ptr)) {
      m.optimizer_state += static_cast<int64_t>(t.nbytes());
    }
  }
  if (const ddp::wrap::WrappedModel* wrapped = run.wrapped()) {
    m.peak_gathered = wrapped->peak_gathered_bytes();
    m.peak_by_owner = wrapped->peak_gathered_by_owner();
  }
  m.phases = phases;
  // Eager steps reset the peak per phase: the step's peak is the largest phase's.
  m.device_peak = phases.forward_peak >= 0 ? phases.peak()
                                           : ddp::obs::device_peak_allocated_bytes(run.device());
  return m;
}

// Rank 0's result: one line (or JSON object) as the reference prints it, and with --verbose the
// stats and memory lines.
void print_result(const Args& args, ddp::tools::TrainingRun& run, const Memory& memory,
                  const ddp::tools::InitReport& init, const std::vector<double>& step_ms,
                  const std::optional<ddp::tools::CommFloor>& floor,
                  const GroupBytes& bytes_per_step) {
  const Stats s = summarize(step_ms);
  const int timed = static_cast<int>(step_ms.size());
  std::string line;
  if (args.json) {
    // Field order is the reference's (bench/reference/torch_ddp.py --json); times rounded to
    // the microsecond, as the text line.
    const auto ms = [](double v) { return std::round(v * 1000.0) / 1000.0; };
    nlohmann::ordered_json result;
    result["model"] = args.model;
    result["world"] = run.world_size();
    result["batch"] = args.batch_size;
    result["device"] = args.device;
    result["side"] = "ours";
    result["median_ms"] = ms(s.median);
    result["mean_ms"] = ms(s.mean);
    result["min_ms"] = ms(s.min);
    result["repeat"] = timed;
    std::vector<double> init_s;
    for (const double v : init.seconds) init_s.push_back(ms(v));  // to the millisecond
    result["init_s"] = init_s;
    result["init_peak_bytes"] = init.peak_bytes;
    result["memory"] = {{"param_bytes", memory.params},
                        {"grad_bytes", memory.grads},
                        {"optimizer_state_bytes", memory.optimizer_state},
                        {"peak_gathered_bytes", memory.peak_gathered},
                        {"device_peak_allocated_bytes", memory.device_peak},
                        {"phases",
                         {{"forward_peak_bytes", memory.phases.forward_peak},
                          {"backward_peak_bytes", memory.phases.backward_peak},
                          {"optimizer_peak_bytes", memory.phases.optimizer_peak},
                          {"between_steps_bytes", memory.phases.between_steps}}}};
    if (run.wrapped()) {
      result["memory"]["gathered_by_owner"] = {
          {"full_params_bytes", memory.peak_by_owner.full_params},
          {"gather_output_bytes", memory.peak_by_owner.gather_output},
          {"reduce_input_bytes", memory.peak_by_owner.reduce_input}};
    }
    if (!run.memory_estimates().empty()) result["memory_estimate"] = estimate_json(run);
    if (args.no_comm) result["collectives"] = "fake";
    if (!bytes_per_step.empty()) {
      nlohmann::ordered_json bytes;
      for (const auto& [group, n] : bytes_per_step) bytes[group] = n;
      result["bytes_per_step"] = bytes;
    }
    if (floor) {
      result["comm_floor"] = {{"median_ms", ms(floor->median_ms)},
                              {"collectives", floor->collectives},
                              {"skipped", floor->skipped},
                              {"bytes", floor->bytes}};
    }
    line = result.dump();
  } else {
    char text[512];
    std::snprintf(text, sizeof(text),
                  "result model=%s world=%d batch=%lld device=%s side=ours median_ms=%.3f "
                  "mean_ms=%.3f min_ms=%.3f repeat=%d style=%s tp=%lld",
                  args.model.c_str(), run.world_size(), static_cast<long long>(args.batch_size),
                  args.device.c_str(), s.median, s.mean, s.min, timed,
                  args.shard.chosen ? args.shard.style.c_str() : "none",
                  static_cast<long long>(args.tp));
    line = text;
    if (args.no_comm) line += " collectives=fake";
    if (floor) {
      std::snprintf(text, sizeof(text), " comm_floor_ms=%.3f comm_floor_collectives=%d",
                    floor->median_ms, floor->collectives);
      line += text;
    }
  }
  if (args.json) {
    print_json_line(line);
  } else {
    std::cout << line << "\n";
  }
  if (args.ddp.verbose && !bytes_per_step.empty()) {
    std::string text = "ddp-bench: bytes this rank sent per step:";
    for (const auto& [group, n] : bytes_per_step) text += " " + group + " " + std::to_string(n);
    std::cout << text << "\n";
  }
  if (args.ddp.verbose && run.wrapped()) {
    std::cout << ddp::obs::format_summary(run.wrapped()->logging_data());
  }
  if (args.ddp.verbose) {
    std::printf(
        "memory per rank (bytes): parameters %lld, gradients %lld, optimizer state %lld, "
        "peak gathered %lld, device peak allocated %lld\n",
        static_cast<long long>(memory.params), static_cast<long long>(memory.grads),
        static_cast<long long>(memory.optimizer_state),
        static_cast<long long>(memory.peak_gathered), static_cast<long long>(memory.device_peak));
    std::printf(
        "memory by phase (bytes, peaks of the timed steps): forward %lld, backward %lld, "
        "optimizer %lld; between steps %lld\n",
        static_cast<long long>(memory.phases.forward_peak),
        static_cast<long long>(memory.phases.backward_peak),
        static_cast<long long>(memory.phases.optimizer_peak),
        static_cast<long long>(memory.phases.between_steps));
    if (run.wrapped()) {
      std::printf(
          "gathered memory by owner (bytes, each its own peak): full parameter buffers %lld, "
          "all-gather outputs %lld, reduce-scatter inputs %lld\n",
          static_cast<long long>(memory.peak_by_owner.full_params),
          static_cast<long long>(memory.peak_by_owner.gather_output),
          static_cast<long long>(memory.peak_by_owner.reduce_input));
    }
  }
  std::printf("mean latency %.3f ms across %d runs\n", s.mean, timed);
  std::fflush(stdout);
}

// --init-only's line: every rank's init_s and init_peak_bytes, and the bound issue 60 sets for a
// sharded model: this rank's parameters (its shards) plus the largest unit whole, plus 25%.
void print_init_only(const Args& args, ddp::tools::TrainingRun& run,
                     const ddp::tools::InitReport& init) {
  int64_t param_bytes = 0;
  for (const auto& p : run.params()) param_bytes += p.numel() * p.element_size();
  int64_t largest_unit = 0;
  // The unit plan is the sharded runtime's own (no other style has units).
  const auto* sharded =
      run.model() ? dynamic_cast<const ddp::shard::ShardedModule*>(&run.model()->wrapped())
                  : nullptr;
  if (sharded != nullptr) {
    const ddp::shard::ShardPlan& plan = sharded->plan();
    for (const auto& unit : plan.units) {
      int64_t bytes = 0;
      for (size_t i : unit.params) {
        int64_t numel = 1;
        for (int64_t d : plan.shapes[i].shape) numel *= d;
        bytes += numel * static_cast<int64_t>(c10::elementSize(plan.shapes[i].dtype));
      }
      largest_unit = std::max(largest_unit, bytes);
    }
  }
  if (!run.lead()) return;
  nlohmann::ordered_json result;
  result["model"] = args.model;
  result["world"] = run.world_size();
  result["device"] = args.device;
  result["side"] = "ours";
  result["init_s"] = init.seconds;
  result["init_peak_bytes"] = init.peak_bytes;
  result["param_bytes"] = param_bytes;
  result["largest_unit_bytes"] = largest_unit;
  result["init_bound_bytes"] =
      static_cast<int64_t>(1.25 * static_cast<double>(param_bytes + largest_unit));
  if (!run.memory_estimates().empty()) result["memory_estimate"] = estimate_json(run);
  print_json_line(result.dump());
}
}  // namespace ddp::tools::bench
