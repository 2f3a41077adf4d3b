#include "bench_worker.hpp"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

#include "bench_args.hpp"
#include "comm_floor.hpp"
#include "common/captured_recipe.hpp"
#include "common/ddp_flags.hpp"
#include "common/init_report.hpp"
#include "common/json_stdout.hpp"
#include "common/recipe_flags.hpp"
#include "common/run_flags.hpp"
#include "common/tool_error.hpp"
#include "common/training_run.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/models/causal_attention.hpp"
#include "ddp/models/gpt.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/obs/chrome_trace.hpp"
#include "ddp/obs/cpu_memory.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/obs/kernel_trace.hpp"
#include "ddp/obs/step_memory.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/planner/graph_dot.hpp"
#include "result_report.hpp"

namespace ddp::tools::bench {
namespace {

// Steps a --kernel-trace records: the first shows any start-up effect, the middle one is the
// steady state, the third shows the host running ahead into the next step.
constexpr int kKernelTraceSteps = 3;

// Where rank `rank` writes its --kernel-trace.
std::string kernel_trace_path(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}
using Batch = std::pair<torch::Tensor, torch::Tensor>;

// Batches: from --inputs (parity, tensors x.<step>.<data rank>), or one deterministic batch per
// rank made before timing; on the device.
std::vector<Batch> load_batches(const Args& args, ddp::tools::TrainingRun& run) {
  std::vector<Batch> batches;
  const int data_rank = run.data_rank();
  if (args.inputs.empty()) {
    const int64_t per_rank = args.batch_size * args.recipe.grad_accum;
    auto [x, y] = run.workload().batch(data_rank * per_rank, per_rank);
    batches.emplace_back(x.to(run.device()), y.to(run.device()));
    return batches;
  }
  const auto tensors = ddp::io::load_safetensors(args.inputs);
  for (int step = 0;; ++step) {
    const std::string suffix = "." + std::to_string(step) + "." + std::to_string(data_rank);
    auto x = tensors.find("x" + suffix);
    auto y = tensors.find("y" + suffix);
    if (x == tensors.end()) break;
    TORCH_CHECK(y != tensors.end(), "ddp-bench: --inputs file '", args.inputs, "' has x", suffix,
                " but no y", suffix);
    batches.emplace_back(x->second.to(run.device()), y->second.to(run.device()));
  }
  TORCH_CHECK(!batches.empty(), "ddp-bench: --inputs file '", args.inputs,
              "' has no batches for rank ", data_rank, " (expected tensors x.<step>.", data_rank,
              ")");
  return batches;
}

// --grad-accum N: the rank's batch in N equal micro-batches (all but the last under no_sync, each
// loss divided by N: tools/common/recipe_step.hpp).
std::vector<ddp::tools::MicroBatch> micro_batches(const Batch& batch, int micro) {
  const auto& [x, y] = batch;
  TORCH_CHECK(x.size(0) % micro == 0, "ddp-bench: a batch of ", x.size(0),
              " samples cannot be split into --grad-accum ", micro, " equal micro-batches");
  if (micro == 1) return {{x, y}};
  const int64_t n = x.size(0) / micro;
  std::vector<ddp::tools::MicroBatch> out;
  for (int k = 0; k < micro; ++k) out.push_back({x.narrow(0, k * n, n), y.narrow(0, k * n, n)});
  return out;
}

// What the steps leave: the timed steps' times, their trace spans (--profile) and memory by phase,
// and the kernel trace of the steps after them (--kernel-trace).
struct Timing {
  Timing(const Args& args, ddp::tools::TrainingRun& run)
      : trace(run.rank()),
        meter(run.device()),
        warmup(args.inputs.empty() ? args.warmup : 0),
        timed(args.repeat),
        traced(args.kernel_trace.empty() ? 0 : kKernelTraceSteps),
        cuda(run.device().is_cuda()),
        device_index(run.device().index()) {}
  // A step is timed from a synchronized start to a synchronized end, as the PyTorch side does.
  void sync() const {
    if (cuda) torch::cuda::synchronize(device_index);
  }
  std::vector<double> step_ms;
  ddp::obs::ChromeTrace trace;
  ddp::obs::StepMemoryMeter meter;
  std::optional<ddp::obs::KernelTrace> kernel_trace;
  int64_t capture_peak = -1;  // --cuda-graph: the device peak of the step that captured
  // The wrapped model's collectives numbered before the last timed step and after it
  // (--comm-floor); -1: not recorded.
  int64_t issued_before_last = -1, issued_after_last = -1;
  // Each group's ProcessGroup::bytes_sent at the first timed step, then per timed step.
  ddp::tools::bench::GroupBytes bytes_at_start, bytes_per_step;
  int warmup, timed, traced;  // untimed steps first, timed steps, kernel-traced steps after
  bool cuda;
  int device_index;
};

// --cuda-graph: one step function over a static batch, warmed up on the capture stream, then
// captured and replayed: the whole recipe as ddp-train runs it, the rate written before each
// replay. The capture happens in the untimed steps (11 + the capture at least).
void time_captured(const Args& args, ddp::tools::TrainingRun& run, const Batch& batch,
                   std::optional<ddp::tools::CapturedRecipe>& captured, Timing& timing) {
  captured.emplace(run, micro_batches(batch, args.recipe.grad_accum),
                   ddp::tools::CapturedRecipe::Inputs::kFixed);
  ddp::graphs::CapturedStep& step = captured->step();
  const int untimed = std::max(timing.warmup, 12);
  for (int i = 0; i < untimed + timing.timed + timing.traced; ++i) {
    timing.sync();
    if (i == untimed + timing.timed) timing.kernel_trace.emplace();
    const int64_t t0 = ddp::obs::trace_now_ns();
    if (run.scheduled()) ddp::optim::set_lr(*run.optimizer(), run.lr_at(i));  // outside the graph
    // A replay allocates nothing: the captured step's memory is what its capture allocated in the
    // graph's pool, so the peak of the run that captured is the captured step's.
    const bool warming_up = step.state() == ddp::graphs::CapturedStep::State::kWarmingUp;
    if (warming_up) ddp::obs::reset_device_peak(run.device());
    step.run();
    timing.sync();
    if (warming_up && step.state() == ddp::graphs::CapturedStep::State::kReplaying) {
      timing.capture_peak = ddp::obs::device_peak_allocated_bytes(run.device());
    }
    const int64_t t3 = ddp::obs::trace_now_ns();
    TORCH_CHECK(args.no_comm || std::isfinite(captured->loss().item<double>()),
                "ddp-bench: the loss became non-finite at step ", i, " (learning rate ", run.lr(),
                "); lower --lr");
    if (i >= untimed && i < untimed + timing.timed) {
      timing.step_ms.push_back(static_cast<double>(t3 - t0) / 1e6);
    }
    if (i + 1 == untimed) {
      if (run.wrapped()) run.wrapped()->reset_peak_memory();
      ddp::obs::reset_device_peak(run.device());
    }
  }
  if (run.lead() && args.ddp.verbose) {
    std::cout << "ddp-bench: cuda graph " << ddp::graphs::describe(step) << std::endl;
  }
}

// Eager steps: the recipe step with a timestamp and the memory meter at each phase's end. The
// per-phase times need a device synchronization between phases, which would also stop the host
// from running ahead of the device; only --profile pays for them.
void time_eager(const Args& args, ddp::tools::TrainingRun& run, const std::vector<Batch>& batches,
                Timing& timing) {
  int i = 0;
  bool measured = false;  // a timed step: its memory by phase (allocator statistics, no sync)
  int64_t t1 = 0, t2 = 0;
  ddp::tools::RecipeStep recipe = run.recipe();
  recipe.on_phase = [&](ddp::tools::RecipePhase phase, const torch::Tensor& loss) {
    if (args.profile) timing.sync();
    const bool forward_end = phase == ddp::tools::RecipePhase::kForwardEnd;
    (forward_end ? t1 : t2) = ddp::obs::trace_now_ns();
    if (forward_end && i == 0 && run.lead() && !args.graph_dot.empty()) {
      std::ofstream(args.graph_dot)
          << ddp::planner::autograd_graph_dot(loss, run.params(), run.param_names());
    }
    if (!measured) return;
    timing.meter.stop(forward_end ? ddp::obs::StepPhase::kForward : ddp::obs::StepPhase::kBackward);
    timing.meter.start(forward_end ? ddp::obs::StepPhase::kBackward
                                   : ddp::obs::StepPhase::kOptimizer);
  };
  const int steps = timing.warmup + timing.timed + timing.traced;
  const auto issued = [&] {
    return run.wrapped() ? run.wrapped()->group()->collectives_issued() : int64_t{-1};
  };
  const auto bytes_now = [&] {
    ddp::tools::bench::GroupBytes out;
    for (const auto& [name, group] : run.groups()) out.emplace_back(name, group->bytes_sent());
    return out;
  };
  const auto count_bytes = [&] {
    if (timing.timed <= 0 || timing.bytes_at_start.empty()) return;
    timing.bytes_per_step = bytes_now();
    for (size_t g = 0; g < timing.bytes_per_step.size(); ++g) {
      timing.bytes_per_step[g].second =
          (timing.bytes_per_step[g].second - timing.bytes_at_start[g].second) / timing.timed;
    }
  };
  for (; i < steps; ++i) {
    if (i == timing.warmup) timing.bytes_at_start = bytes_now();
    if (i == timing.warmup + timing.timed) count_bytes();
    if (i == timing.warmup + timing.timed - 1) timing.issued_before_last = issued();
    if (i == timing.warmup + timing.timed) timing.issued_after_last = issued();
    const auto inputs =
        micro_batches(batches[static_cast<size_t>(i) % batches.size()], args.recipe.grad_accum);
    timing.sync();
    if (i == timing.warmup + timing.timed) timing.kernel_trace.emplace();
    const int64_t t0 = ddp::obs::trace_now_ns();
    // As the reference's opt.zero_grad() (set_to_none on torch 2.x); in backward: the style's.
    if (torch::optim::Optimizer* opt = run.optimizer()) {
      opt->zero_grad();
    } else {
      run.zero_grad();
    }
    measured = i >= timing.warmup && i < timing.warmup + timing.timed;
    if (measured) timing.meter.start(ddp::obs::StepPhase::kForward);
    if (run.scheduled()) ddp::optim::set_lr(*run.optimizer(), run.lr_at(i));
    const torch::Tensor loss = ddp::tools::run_recipe_step(recipe, inputs);
    timing.sync();
    if (measured) {
      timing.meter.stop(ddp::obs::StepPhase::kOptimizer);
      timing.meter.step_end();
    }
    const int64_t t3 = ddp::obs::trace_now_ns();
    TORCH_CHECK(args.no_comm || std::isfinite(loss.item<double>()),
                "ddp-bench: the loss became non-finite at step ", i, " (learning rate ", run.lr(),
                "); lower --lr");
    if (measured) timing.step_ms.push_back(static_cast<double>(t3 - t0) / 1e6);
    // Peaks of the timed steps only: the first sharded step gathers everything to learn the order
    // in which the model runs its units. (The device's peak is the meter's, per phase.)
    if ((i + 1 == timing.warmup || (timing.warmup == 0 && i == 0)) && run.wrapped()) {
      run.wrapped()->reset_peak_memory();
    }
    if (i + 1 == steps && timing.issued_after_last < 0) timing.issued_after_last = issued();
    if (i + 1 == timing.warmup + timing.timed && timing.traced == 0) count_bytes();
    if (args.profile) {
      timing.trace.add({"forward", "compute", 0, t0, t1, i, -1});
      timing.trace.add({"backward", "compute", 0, t1, t2, i, -1});
      timing.trace.add({"optimizer", "compute", 0, t2, t3, i, -1});
      if (const auto* wrapped = run.wrapped()) {
        timing.trace.add_buckets(wrapped->last_timeline(), wrapped->bucket_plan(), i);
      }
    }
  }
}

// The first line with --verbose: the model, the world, the attention, --tp's plan.
void announce(const Args& args, ddp::tools::TrainingRun& run) {
  int64_t numel = 0;
  for (const auto& p : run.params()) numel += p.numel();
  std::cout << "ddp-bench: model " << args.model << ", " << numel << " parameters, world "
            << run.world_size() << ", device " << args.device << ", batch " << args.batch_size
            << " per rank";
  if (dynamic_cast<const ddp::models::GPTImpl*>(run.workload().ptr.get()) != nullptr) {
    std::cout << ", attention "
              << (ddp::models::causal_attention_is_fused() ? "fused" : "written out")
              << (args.workload.tie_weights ? ", tied wte/lm_head" : "");
  }
  std::cout << std::endl;
  if (const auto& tensor_parallel = run.split().tensor_parallel) {
    std::cout << tensor_parallel->table();
  }
}

}  // namespace

int run_worker(const Args& args) {
  const auto start = std::chrono::steady_clock::now();
  at::set_num_threads(args.threads);
  // --json: stdout carries the JSON objects alone; the text lines (mean latency, --verbose's
  // tables) go to stderr.
  if (args.json) ddp::tools::reserve_stdout_for_json();
  const bool cuda = args.device == "cuda";
  TORCH_CHECK(args.kernel_trace.empty() || (cuda && ddp::obs::KernelTrace::available()),
              "ddp-bench: --kernel-trace needs --device cuda and a CUDA build of libtorch (torch's "
              "Kineto profiler traces the device's kernels)");
  ddp::tools::TrainingRunOptions options;
  options.tool = "ddp-bench";
  // A process group for a style or --tp (a style runs at any world size); neither: the bare
  // model, the world-1 baseline.
  options.backend = distributed(args) ? (cuda ? "nccl" : "gloo") : "";
  options.wrap = args.shard.chosen;
  options.lr = peak_lr(args);
  options.sgd_momentum = 0.0;
  options.init_params = args.init_params;
  options.count_cpu_memory = true;
  options.fake_collectives = args.no_comm;
  // The process group, the model, --tp, the style, the comm hook, the optimizer (or, with
  // --optimizer-overlap, each parameter's inside backward): tools/common/training_run.hpp.
  ddp::tools::TrainingRun run(args, options);
  const ddp::tools::InitReport init = ddp::tools::gather_init_report(run.world(), start);
  if (args.init_only) {
    ddp::tools::bench::print_init_only(args, run, init);
    return 0;
  }
  run.start_clip(/*first_step=*/0);
  const std::vector<Batch> batches = load_batches(args, run);
  if (run.lead() && args.ddp.verbose) announce(args, run);

  Timing timing(args, run);
  if (!args.inputs.empty()) timing.timed = static_cast<int>(batches.size());  // parity: each once
  std::optional<ddp::tools::CapturedRecipe> captured;  // lives until the run's end (its pool)
  if (args.cuda_graph) {
    time_captured(args, run, batches[0], captured, timing);
  } else {
    time_eager(args, run, batches, timing);
  }
  if (timing.kernel_trace) {
    timing.kernel_trace->save(kernel_trace_path(args.kernel_trace, run.rank()));
    if (run.lead())
      std::cout << "ddp-bench: kernel trace of " << timing.traced << " steps in "
                << args.kernel_trace << std::endl;
  }
  if (args.profile) {
    if (run.world()) {
      timing.trace.write_merged(*run.world(), args.trace_file);
    } else {
      timing.trace.write(args.trace_file);
    }
    if (run.lead()) std::cerr << "ddp-bench: wrote trace " << args.trace_file << std::endl;
  }
  Memory memory = ddp::tools::bench::measure_memory(run, timing.meter.result());
  memory.device_peak = std::max(memory.device_peak, timing.capture_peak);
  if (!args.save_params.empty()) {
    // Collective: every parameter gathered by its layout (sharded, --tp, or both nested).
    const ddp::io::TensorMap whole = run.whole_weights();
    ddp::io::TensorMap out;
    for (const auto& name : run.param_names()) out[name] = whole.at(name);
    if (run.lead()) ddp::io::save_safetensors(args.save_params, out);
  }
  std::optional<ddp::tools::CommFloor> floor;
  if (args.comm_floor > 0) {
    floor = ddp::tools::comm_floor(*run.wrapped()->group(), timing.issued_before_last + 1,
                                   timing.issued_after_last, args.comm_floor);
  }
  if (run.lead())
    ddp::tools::bench::print_result(args, run, memory, init, timing.step_ms, floor,
                                    timing.bytes_per_step);
  if (run.world()) run.world()->barrier("end of benchmark");
  return 0;
}

}  // namespace ddp::tools::bench
