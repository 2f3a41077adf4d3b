// ddp-bench: the benchmark harness (the seed's benchmarks/dynamo/distributed.py, natively). A step
// is forward + loss + backward + SGD step, timed per iteration; rank 0 prints the result line and
// "mean latency X ms across N runs". The flags and output are shared with
// bench/reference/torch_ddp.py (docs/bench-protocol.md).

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

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
#include "common/flag_parse.hpp"
#include "common/init_report.hpp"
#include "common/json_stdout.hpp"
#include "common/recipe_flags.hpp"
#include "common/run_flags.hpp"
#include "common/tool_error.hpp"
#include "common/training_run.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/launch/spawn.hpp"
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

namespace {

using ddp::tools::bench::Args;
using ddp::tools::bench::Memory;

// Steps a --kernel-trace records: the first shows any start-up effect, the middle one is the
// steady state, the third shows the host running ahead into the next step.
constexpr int kKernelTraceSteps = 3;

// Where rank `rank` writes its --kernel-trace.
std::string kernel_trace_path(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}
// The peak learning rate: --lr, else the model's own (run_flags.hpp); known before any worker
// starts, so a schedule is checked against it there.
double peak_lr(const Args& args) {
  return args.lr > 0 ? args.lr : ddp::models::workload_lr(args.model, args.workload);
}

// Why --cuda-graph cannot run with these flags, or "": each refused flag needs something a
// captured step cannot do (a host-side timer per phase, a host copy per step, a step-1 graph).
std::string cuda_graph_refusal(const Args& args) {
  if (!args.cuda_graph) return "";
  if (std::string common = ddp::tools::cuda_graph_refusal(args, args.ddp.gradients);
      !common.empty())
    return common;
  if (args.profile) return "--cuda-graph cannot be combined with --profile (per-phase timers)";
  if (!args.inputs.empty()) return "--cuda-graph cannot be combined with --inputs (parity runs)";
  if (!args.graph_dot.empty()) return "--cuda-graph cannot be combined with --graph-dot";
  if (args.comm_floor > 0) {
    return "--cuda-graph cannot be combined with --comm-floor (it replays an eager step's "
           "collectives)";
  }
  return "";
}

// A process group is made: DDP, or a sharded style (which runs at any world size).
bool distributed(const Args& args) { return args.shard.chosen || args.tp > 0; }

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

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "ddp-bench: step time of a zoo model under a data-parallel style (--style, --tp), ours or "
      "alone (forward, loss, backward, the optimizer step of --optimizer)"};
  ddp::tools::add_run_flags(app, args, args.ddp.verbose);
  app.add_flag("--toy-model", args.toy_model, "the seed Net(2000): same as --model toy");
  ddp::tools::add_model_flags(app, args.workload);
  ddp::tools::add_tp_flag(app, args.tp);
  ddp::tools::add_shard_flags(app, args.shard);
  app.add_option("--repeat", args.repeat, "timed steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", args.warmup, "untimed steps first")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  ddp::tools::add_ddp_flags(app, args.ddp);
  ddp::tools::add_comm_hook_flag(app, args.comm_hook);
  ddp::tools::add_recipe_flags(app, args.recipe, {"sgd", "adam", "adamw"});
  app.add_flag("--autocast-bf16", args.autocast_bf16,
               "forward and loss under bf16 autocast (parameters and gradients stay fp32)");
  app.add_flag("--json", args.json, "one JSON object per result");
  app.add_flag("--no-comm", args.no_comm,
               "every collective a no-op: the step's compute alone at this world size (its "
               "shards, its memory); the model does not train");
  app.add_option("--comm-floor", args.comm_floor,
                 "after the timed steps, replay the last timed step's collectives N times back to "
                 "back with no compute and report their median (comm_floor in --json)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--init-only", args.init_only,
               "build, shard and wrap the model, print the initialisation's time and resident "
               "peak per rank beside the bound (this rank's parameter bytes plus the largest "
               "unit's, plus 25%), take no step");
  app.add_flag("--profile", args.profile, "write a Chrome trace");
  app.add_option("--kernel-trace", args.kernel_trace,
                 "after the timed steps, trace 3 more with torch's Kineto profiler (every kernel "
                 "on its stream) into this Chrome trace JSON; rank r > 0 writes FILE.rank<r>");
  app.add_option("--trace-file", args.trace_file, "Chrome trace path")->capture_default_str();
  app.add_option("--graph-dot", args.graph_dot, "write the autograd graph as Graphviz DOT");
  app.add_option("--init-params", args.init_params, "load parameters by name (safetensors)");
  app.add_option("--inputs", args.inputs, "parity batches x.<step>.<rank>, y.<step>.<rank>");
  app.add_option("--save-params", args.save_params, "rank 0 saves final parameters (safetensors)");
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "ddp-bench"); code >= 0)
    return code;
  if (args.toy_model) args.model = "toy";
  if (const std::string wrong = ddp::tools::check_model_flags(args.model, args.workload, args.tp);
      !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  {
    const double lr = peak_lr(args);
    const std::string wrong =
        ddp::tools::check_recipe_flags(app, args.recipe, lr, args.optimizer_overlap);
    if (!wrong.empty()) {
      std::cerr << "ddp-bench: " << wrong << std::endl;
      return 2;
    }
  }

  if (const std::string wrong = cuda_graph_refusal(args); !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  std::vector<std::string> ddp_only;
  if (args.comm_hook == "powersgd") ddp_only.push_back("--comm-hook powersgd");
  if (const std::string wrong = ddp::tools::check_shard_flags(args.shard, ddp_only);
      !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  // The floors measure a wrapped model's step: its collectives, or its compute without them.
  if ((args.no_comm || args.comm_floor > 0) && !args.shard.chosen) {
    std::cerr << "ddp-bench: " << (args.no_comm ? "--no-comm" : "--comm-floor")
              << " needs --ddp or a sharded --style (the plain model issues no collectives)"
              << std::endl;
    return 2;
  }
  if (args.no_comm && args.comm_floor > 0) {
    std::cerr << "ddp-bench: --no-comm and --comm-floor measure the two floors in separate runs "
                 "(with --no-comm there are no collectives to replay)"
              << std::endl;
    return 2;
  }
  if (const std::string wrong = ddp::tools::environment_refusal(args, "DDP_BENCH_WORKER");
      !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  try {
    // Under a launcher (torchrun, ddp-run, mpirun, srun: comm/env.hpp) this process is a worker.
    const bool under_launcher = ddp::comm::launcher_from_env(ddp::comm::process_env()).has_value();
    const bool worker =
        std::getenv("DDP_BENCH_WORKER") != nullptr || (under_launcher && args.nproc == 0);
    if (worker || !distributed(args)) {
      TORCH_CHECK(distributed(args) || args.nproc <= 1, "ddp-bench: --nproc ", args.nproc,
                  " needs --ddp or a sharded --style (without them the plain model "
                  "runs in one process, the world-1 baseline)");
      return run_worker(args);
    }
    ddp::launch::SpawnOptions spawn;
    spawn.nproc = args.nproc > 0 ? args.nproc : 1;
    spawn.prefix_rank0_stdout = !args.json;  // --json: rank 0's stdout is JSON lines, unprefixed
    if (const std::string wrong = ddp::tools::tp_world_refusal(args.tp, spawn.nproc);
        !wrong.empty()) {
      std::cerr << "ddp-bench: " << wrong << std::endl;
      return 2;
    }
    if (args.tp > 0 && spawn.nproc != args.tp && !args.shard.chosen) {
      std::cerr << "ddp-bench: --tp " << args.tp << " at world size " << spawn.nproc << " leaves "
                << spawn.nproc / args.tp << " data-parallel ranks: add --ddp or a sharded --style"
                << std::endl;
      return 2;
    }
    spawn.timeout = std::chrono::hours(2);
    spawn.name = "ddp-bench";
    spawn.flight_recorder_dir = args.flight_recorder;
    // Unprefixed: rank 0's result lines are parsed by bench/compare as lines that start with
    // "result " or "{", and only rank 0 prints them.
    spawn.relay_output = false;
    return ddp::launch::run_self_as_workers(argc, argv, "DDP_BENCH_WORKER", spawn);
  } catch (const c10::Error& e) {
    std::cerr << ddp::tools::tool_error("ddp-bench", e.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << ddp::tools::tool_error("ddp-bench", e.what()) << std::endl;
    return 1;
  }
}
