// ddp-bench: the benchmark harness (the seed's benchmarks/dynamo/distributed.py, natively). A step
// is forward + loss + backward + SGD step, timed per iteration; rank 0 prints the result line and
// "mean latency X ms across N runs". The flags and output are shared with
// bench/reference/torch_ddp.py (docs/bench-protocol.md).

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <sstream>

#include "common/ddp_flags.hpp"
#include "common/flag_parse.hpp"
#include "common/recipe_flags.hpp"
#include "common/recipe_step.hpp"
#include "common/run_flags.hpp"
#include "common/tensor_parallel_setup.hpp"
#include "common/tool_error.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/io/checkpoint_state.hpp"
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
#include "ddp/optim/device_step.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "ddp/planner/graph_dot.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/unit/module_intake.hpp"

namespace {

// The shared run flags (tools/common/run_flags.hpp) with this tool's defaults: --model toy and
// SGD at --lr 0.01, as bench/reference/torch_ddp.py.
struct Args : ddp::tools::RunFlags {
  Args() {
    model = "toy";
    lr = 0.01;
  }
  bool toy_model = false;
  ddp::models::WorkloadOptions workload;  // --tie-weights (tools/common)
  int64_t tp = 0;  // --tp N: tensor parallel over N ranks of a (world / N, N) mesh; 0: none
  ddp::tools::ShardFlags shard;  // --fsdp, --style, --fsdp-wrap, ... (tools/common)
  int repeat = 10;
  int warmup = 3;
  std::string comm_hook = "allreduce";
  ddp::DDPOptions options;  // the DDP flags (tools/common) write here; --verbose too
  bool autocast_bf16 = false;
  // --optimizer (sgd: momentum 0, bench/reference/torch_ddp.py's), the schedule, --grad-clip,
  // --grad-accum: common/recipe_flags.hpp. With --grad-accum N a step runs N micro-batches of
  // --batch-size per rank (an --inputs batch is split into N).
  ddp::tools::RecipeFlags recipe;
  bool json = false;
  bool profile = false;
  std::string trace_file = "profile.json";
  // --kernel-trace FILE: kKernelTraceSteps more steps after the timed ones, untimed, traced by
  // Kineto (obs/kernel_trace.hpp); rank r > 0 writes FILE.rank<r>.
  std::string kernel_trace;
  std::string graph_dot;
  std::string init_params;
  std::string inputs;
  std::string save_params;
};

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

// Distinct named parameters, registration order (tied weights once).
std::vector<std::pair<std::string, torch::Tensor>> named_params(torch::nn::Module& m) {
  const ddp::unit::ModuleIntake intake = ddp::unit::take_in(m);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < intake.params.size(); ++i)
    out.emplace_back(intake.names[i], intake.params[i]);
  return out;
}

void load_params(torch::nn::Module& m, const std::string& path) {
  const auto tensors = ddp::io::load_safetensors(path);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : named_params(m)) {
    auto it = tensors.find(name);
    TORCH_CHECK(it != tensors.end(), "ddp-bench: --init-params file '", path,
                "' has no tensor for parameter '", name, "'");
    TORCH_CHECK(it->second.sizes() == p.sizes(), "ddp-bench: --init-params: parameter '", name,
                "' has shape ", p.sizes(), " but the file holds ", it->second.sizes());
    p.copy_(it->second);
  }
}

// What a rank holds after the last step (storage bytes), and the peaks of the timed steps.
struct Memory {
  int64_t params = 0, grads = 0, optimizer_state = 0;
  int64_t peak_gathered = 0;               // gathered units and collective buffers (0: DDP)
  ddp::wrap::GatheredBytes peak_by_owner;  // the same by owner
  // The caching allocator's peak on CUDA, the counted tensor storages' on the CPU; -1: none.
  // --cuda-graph: that of the step captured (its replays allocate nothing), if larger.
  int64_t device_peak = -1;
  ddp::obs::StepMemory phases;  // eager steps: the same by phase
};

Memory measure_memory(torch::nn::Module& module, torch::optim::Optimizer& opt,
                      const ddp::wrap::WrappedModel* wrapped, const torch::Device& device,
                      const ddp::obs::StepMemory& phases) {
  Memory m;
  for (auto& [name, p] : named_params(module)) {
    m.params += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) m.grads += static_cast<int64_t>(p.grad().nbytes());
  }
  for (const auto& [key, t] : ddp::io::optimizer_tensors(opt, module)) {
    m.optimizer_state += static_cast<int64_t>(t.nbytes());
  }
  if (wrapped) {
    m.peak_gathered = wrapped->peak_gathered_bytes();
    m.peak_by_owner = wrapped->peak_gathered_by_owner();
  }
  m.phases = phases;
  // Eager steps reset the peak per phase: the step's peak is the largest phase's.
  m.device_peak =
      phases.forward_peak >= 0 ? phases.peak() : ddp::obs::device_peak_allocated_bytes(device);
  return m;
}

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
  if (std::string common = ddp::tools::cuda_graph_refusal(args, args.options.reducer);
      !common.empty())
    return common;
  if (args.profile) return "--cuda-graph cannot be combined with --profile (per-phase timers)";
  if (!args.inputs.empty()) return "--cuda-graph cannot be combined with --inputs (parity runs)";
  if (!args.graph_dot.empty()) return "--cuda-graph cannot be combined with --graph-dot";
  return "";
}

// A process group is made: DDP, or a sharded style (which runs at any world size).
bool distributed(const Args& args) { return args.shard.chosen || args.tp > 0; }

int run_worker(const Args& args) {
  at::set_num_threads(args.threads);
  ddp::comm::ProcessGroupPtr pg;
  int rank = 0, world = 1;
  if (distributed(args)) {
    const ddp::comm::InitOptions init =
        ddp::tools::init_options(args, args.device == "cuda" ? "nccl" : "gloo");
    pg = ddp::comm::init_process_group(init);
    rank = pg->rank();
    world = pg->world_size();
  }
  const bool lead = rank == 0;
  const bool cuda = args.device == "cuda";
  TORCH_CHECK(args.kernel_trace.empty() || (cuda && ddp::obs::KernelTrace::available()),
              "ddp-bench: --kernel-trace needs --device cuda and a CUDA build of libtorch (torch's "
              "Kineto profiler traces the device's kernels)");
  int local_rank = 0;
  if (const char* lr = std::getenv("LOCAL_RANK")) local_rank = std::atoi(lr);
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, local_rank) : torch::kCPU;
  // On the CPU the peak comes from counting tensor storages (the model's included: from here on).
  if (!cuda) ddp::obs::count_cpu_memory();
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize(local_rank);
  };
  // Per-phase times need a device synchronization between phases, which would also stop the host
  // from running ahead of the device; only --profile pays for them. A step is timed from a
  // synchronized start to a synchronized end, as the PyTorch side does.
  auto phase_sync = [&] {
    if (args.profile) sync();
  };

  auto w = ddp::models::make_workload(args.model, args.workload);
  if (args.shard.checkpoint) {
    TORCH_CHECK(w.set_checkpointing, "--fsdp-checkpoint: model ", args.model,
                " has no activation checkpointing");
    w.set_checkpointing(true);
  }
  if (!args.init_params.empty()) load_params(*w.ptr, args.init_params);
  w.ptr->to(device);
  // --tp: the model is split over the mesh's "tp" dim first; data parallelism runs over "dp", and
  // the ranks of one tp group read the same batch (their dp coordinate's).
  TORCH_CHECK(args.tp == 0 || world == args.tp || args.shard.chosen, "ddp-bench: --tp ", args.tp,
              " at world size ", world, " leaves ", world / std::max<int64_t>(args.tp, 1),
              " data-parallel ranks: add --ddp or a sharded --style");
  const auto split = ddp::tools::setup_tensor_parallel("ddp-bench", args.tp, pg, w, args.model);
  const auto& tensor_parallel = split.tensor_parallel;
  const ddp::comm::ProcessGroupPtr& dp_group = split.dp_group;
  const int data_rank = split.data_rank;

  // Batches: from --inputs (parity), or one deterministic batch per rank made before timing.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  if (!args.inputs.empty()) {
    const auto tensors = ddp::io::load_safetensors(args.inputs);
    for (int step = 0;; ++step) {
      const std::string suffix = "." + std::to_string(step) + "." + std::to_string(data_rank);
      auto x = tensors.find("x" + suffix);
      auto y = tensors.find("y" + suffix);
      if (x == tensors.end()) break;
      TORCH_CHECK(y != tensors.end(), "ddp-bench: --inputs file '", args.inputs, "' has x", suffix,
                  " but no y", suffix);
      batches.emplace_back(x->second.to(device), y->second.to(device));
    }
    TORCH_CHECK(!batches.empty(), "ddp-bench: --inputs file '", args.inputs,
                "' has no batches for rank ", data_rank, " (expected tensors x.<step>.", data_rank,
                ")");
  } else {
    const int64_t per_rank = args.batch_size * args.recipe.grad_accum;
    auto [x, y] = w.batch(data_rank * per_rank, per_rank);
    batches.emplace_back(x.to(device), y.to(device));
  }
  const bool parity = !args.inputs.empty();
  const int warmup = parity ? 0 : args.warmup;
  const int timed = parity ? static_cast<int>(batches.size()) : args.repeat;

  // A style (--style, --ddp or --fsdp): the one entry point (parallel/data_parallel.hpp) around the
  // same AnyModule; neither: the bare model, the world-1 baseline.
  std::optional<ddp::DataParallel<torch::nn::AnyModule>> wrapped;
  if (args.shard.chosen) {
    ddp::DataParallelOptions dp_options;
    dp_options.ddp = args.options;
    // The table once per job: under --tp every dp group has a rank 0 of its own.
    dp_options.ddp.verbose = args.options.verbose && lead;
    dp_options.shard = args.shard.options;
    dp_options.shard.verbose = dp_options.ddp.verbose;
    if (args.shard.fsdp_wrap) dp_options.shard.units = w.wrap_units;
    wrapped.emplace(w.module, dp_group, ddp::shard::parse_style(args.shard.style),
                    std::move(dp_options));
  }
  // The style's runtime, asked as every style's base (wrap/wrapped_model.hpp); null: none.
  ddp::wrap::WrappedModel* const runtime = wrapped ? &wrapped->wrapped() : nullptr;

  // Every style's gradients go through one runtime: the hook reduces DDP's buckets and the
  // sharded units alike (reduce-scatter).
  if (auto hook = ddp::tools::make_comm_hook(args.comm_hook, dp_group)) {
    if (wrapped) wrapped->register_comm_hook(hook);
  }
  std::vector<torch::Tensor> params;
  for (auto& [name, p] : named_params(*w.ptr)) params.push_back(p);
  const double lr = peak_lr(args);
  // One optimizer for eager and captured steps (optim/sgd.hpp, optim/adam.hpp): its rate and step
  // count on the device, fused kernels on CUDA.
  const auto opt = ddp::tools::make_optimizer(args.recipe, params, lr, /*sgd_momentum=*/0.0);
  const ddp::optim::LrScheduleOptions schedule = ddp::tools::schedule_of(args.recipe, lr);
  const bool scheduled = ddp::tools::has_schedule(args.recipe);
  // The clip's norm and skip flag stay on the device; the optimizer drops a non-finite step there.
  std::optional<ddp::optim::GradClipper> clipper =
      ddp::tools::make_clipper(args.recipe, device, /*first_step=*/0, opt.get());
  // The gradients as this rank holds them, split by the style and --tp (for --grad-clip).
  const auto grad_shards = [&] {
    if (wrapped) return ddp::parallel::grad_shards(*wrapped, tensor_parallel.get());
    return ddp::parallel::split_grad_shards(*w.ptr, nullptr, tensor_parallel.get(), nullptr);
  };
  if (args.optimizer_overlap) {
    TORCH_CHECK(wrapped, "ddp-bench: --optimizer-overlap needs --ddp or --fsdp");
    // Each parameter's SGD step runs inside backward once its bucket is reduced (a sharded unit:
    // at the end of backward, on its shard); opt.step() is then skipped (see below).
    const auto factory = [lr](const torch::Tensor& p) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<ddp::optim::Sgd>(std::vector<torch::Tensor>{p},
                                               torch::optim::SGDOptions(lr));
    };
    wrapped->set_optimizer_in_backward(factory);
  }
  if (lead && args.options.verbose) {
    int64_t numel = 0;
    for (const auto& p : params) numel += p.numel();
    std::cout << "ddp-bench: model " << args.model << ", " << numel << " parameters, world "
              << world << ", device " << args.device << ", batch " << args.batch_size
              << " per rank";
    if (dynamic_cast<const ddp::models::GPTImpl*>(w.ptr.get()) != nullptr) {
      std::cout << ", attention "
                << (ddp::models::causal_attention_is_fused() ? "fused" : "written out")
                << (args.workload.tie_weights ? ", tied wte/lm_head" : "");
    }
    std::cout << std::endl;
    if (tensor_parallel) std::cout << tensor_parallel->table();
  }

  ddp::obs::ChromeTrace trace(rank);
  std::vector<double> step_ms;
  // --cuda-graph: one step function over a static batch, warmed up on the capture stream, then
  // captured and replayed: the whole recipe (micro-batches, autocast, clip, the optimizer) as
  // ddp-train runs it (tools/common/recipe_step.hpp), the rate written before each replay. The
  // capture happens in the untimed steps.
  std::unique_ptr<ddp::graphs::CapturedStep> captured;
  torch::Tensor graph_loss;
  if (args.cuda_graph) {
    const auto& [x, y] = batches[0];
    const int micro = args.recipe.grad_accum;
    TORCH_CHECK(x.size(0) % micro == 0, "ddp-bench: a batch of ", x.size(0),
                " samples cannot be split into --grad-accum ", micro, " equal micro-batches");
    std::vector<ddp::tools::MicroBatch> inputs;
    for (int k = 0; k < micro; ++k) {
      const int64_t n = x.size(0) / micro;
      inputs.push_back({x.narrow(0, k * n, n), y.narrow(0, k * n, n)});
    }
    ddp::tools::RecipeStep recipe;
    recipe.wrapped = wrapped ? &*wrapped : nullptr;
    recipe.forward = [&](const torch::Tensor& in) {
      return wrapped ? (*wrapped)(in) : w.module.forward(in);
    };
    recipe.loss = [&](const torch::Tensor& out, const torch::Tensor& target) {
      return w.loss(out, target);
    };
    recipe.autocast_bf16 = args.autocast_bf16;
    recipe.device = device;
    recipe.clipper = clipper ? &*clipper : nullptr;
    recipe.grad_shards = grad_shards;
    recipe.optimizer = args.optimizer_overlap ? nullptr : opt.get();
    graph_loss = torch::zeros({}, torch::TensorOptions().device(device));
    ddp::graphs::CapturedStepOptions graph_options;  // replays bounded as ddp-train's
    graph_options.replay_timeout = std::chrono::seconds(args.timeout_s);
    graph_options.group = pg;
    captured = std::make_unique<ddp::graphs::CapturedStep>(
        [&, recipe, inputs] {
          // Dropped: the backward makes them in the graph's pool; DDP's reducer copies them into
          // its buckets and a sharded unit's reduced shard becomes them, instead of a zero and an
          // add per parameter (154 more kernels in the gpt-char FULLY_SHARD graph).
          ddp::optim::zero_grad(*opt, /*set_to_none=*/true);
          graph_loss.copy_(ddp::tools::run_recipe_step(recipe, inputs));
        },
        device, graph_options);
  }
  const int untimed = args.cuda_graph ? std::max(warmup, 12) : warmup;  // 11 + the capture
  const int traced = args.kernel_trace.empty() ? 0 : kKernelTraceSteps;
  std::optional<ddp::obs::KernelTrace> kernel_trace;
  ddp::obs::StepMemoryMeter meter(device);
  int64_t capture_peak = -1;  // --cuda-graph: the device peak of the step that was captured
  for (int i = 0; args.cuda_graph && i < untimed + timed + traced; ++i) {
    sync();
    if (i == untimed + timed) kernel_trace.emplace();
    const int64_t t0 = ddp::obs::trace_now_ns();
    if (scheduled) ddp::optim::set_lr(*opt, ddp::optim::lr_at(schedule, i));  // outside the graph
    // A replay allocates nothing: the captured step's memory is what its capture allocated in the
    // graph's pool, so the peak of the run that captured is the captured step's.
    const bool warming_up = captured->state() == ddp::graphs::CapturedStep::State::kWarmingUp;
    if (warming_up) ddp::obs::reset_device_peak(device);
    captured->run();
    sync();
    if (warming_up && captured->state() == ddp::graphs::CapturedStep::State::kReplaying) {
      capture_peak = ddp::obs::device_peak_allocated_bytes(device);
    }
    const int64_t t3 = ddp::obs::trace_now_ns();
    TORCH_CHECK(std::isfinite(graph_loss.item<double>()),
                "ddp-bench: the loss became non-finite at step ", i, " (learning rate ", lr,
                "); lower --lr");
    if (i >= untimed && i < untimed + timed) step_ms.push_back(static_cast<double>(t3 - t0) / 1e6);
    if (i + 1 == untimed) {
      if (runtime) runtime->reset_peak_memory();
      ddp::obs::reset_device_peak(device);
    }
  }
  if (captured && lead && args.options.verbose) {
    std::cout << "ddp-bench: cuda graph " << ddp::graphs::describe(*captured) << std::endl;
  }
  for (int i = 0; !args.cuda_graph && i < warmup + timed + traced; ++i) {
    const auto& [x, y] = batches[static_cast<size_t>(i) % batches.size()];
    sync();
    if (i == warmup + timed) kernel_trace.emplace();
    const int64_t t0 = ddp::obs::trace_now_ns();
    opt->zero_grad();
    // The timed steps' memory by phase (allocator statistics: no synchronization).
    const bool measured = i >= warmup && i < warmup + timed;
    if (measured) meter.start(ddp::obs::StepPhase::kForward);
    // --grad-accum N: the rank's batch in N equal micro-batches; all but the last under no_sync,
    // each loss divided by N (the timer's forward phase is the last micro-batch's).
    const int micro = args.recipe.grad_accum;
    TORCH_CHECK(x.size(0) % micro == 0, "ddp-bench: a batch of ", x.size(0),
                " samples cannot be split into --grad-accum ", micro, " equal micro-batches");
    const int64_t n = x.size(0) / micro;
    const auto micro_loss = [&](int k) {
      std::optional<ddp::parallel::AutocastGuard> autocast;
      if (args.autocast_bf16) autocast.emplace(device.type(), torch::kBFloat16);
      const torch::Tensor xs = micro > 1 ? x.narrow(0, k * n, n) : x;
      const torch::Tensor ys = micro > 1 ? y.narrow(0, k * n, n) : y;
      const torch::Tensor out = wrapped ? (*wrapped)(xs) : w.module.forward(xs);
      return w.loss(out, ys);
    };
    torch::Tensor accumulated;  // the mean of the first N - 1 micro-batches' losses, / N each
    for (int k = 0; k + 1 < micro; ++k) {
      torch::Tensor l;
      if (wrapped) {
        auto quiet = wrapped->no_sync();  // gradients accumulate locally
        l = micro_loss(k);
        (l / micro).backward();
      } else {
        l = micro_loss(k);
        (l / micro).backward();
      }
      accumulated = k == 0 ? l.detach() / micro : accumulated + l.detach() / micro;
    }
    torch::Tensor loss = micro_loss(micro - 1);
    phase_sync();
    const int64_t t1 = ddp::obs::trace_now_ns();
    if (i == 0 && lead && !args.graph_dot.empty()) {
      std::vector<std::string> names;
      for (auto& [name, p] : named_params(*w.ptr)) names.push_back(name);
      std::ofstream(args.graph_dot) << ddp::planner::autograd_graph_dot(loss, params, names);
    }
    if (measured) {
      meter.stop(ddp::obs::StepPhase::kForward);
      meter.start(ddp::obs::StepPhase::kBackward);
    }
    (micro > 1 ? loss / micro : loss).backward();
    if (micro > 1) loss = accumulated + loss.detach() / micro;
    if (clipper) clipper->clip(grad_shards());  // a non-finite step: the optimizer drops it
    phase_sync();
    const int64_t t2 = ddp::obs::trace_now_ns();
    if (measured) {
      meter.stop(ddp::obs::StepPhase::kBackward);
      meter.start(ddp::obs::StepPhase::kOptimizer);
    }
    if (scheduled) ddp::optim::set_lr(*opt, ddp::optim::lr_at(schedule, i));
    if (!args.optimizer_overlap) opt->step();
    sync();
    if (measured) {
      meter.stop(ddp::obs::StepPhase::kOptimizer);
      meter.step_end();
    }
    const int64_t t3 = ddp::obs::trace_now_ns();
    TORCH_CHECK(std::isfinite(loss.item<double>()),
                "ddp-bench: the loss became non-finite at step ", i, " (learning rate ", lr,
                "); lower --lr");
    if (i >= warmup && i < warmup + timed) step_ms.push_back(static_cast<double>(t3 - t0) / 1e6);
    if (i + 1 == warmup || (warmup == 0 && i == 0)) {
      // Peaks of the timed steps only: the first sharded step gathers everything to learn the
      // order in which the model runs its units. (The device's peak is the meter's, per phase.)
      if (runtime) runtime->reset_peak_memory();
    }
    if (args.profile) {
      trace.add({"forward", "compute", 0, t0, t1, i, -1});
      trace.add({"backward", "compute", 0, t1, t2, i, -1});
      trace.add({"optimizer", "compute", 0, t2, t3, i, -1});
      if (runtime) trace.add_buckets(runtime->last_timeline(), runtime->bucket_plan(), i);
    }
  }

  if (kernel_trace) {
    kernel_trace->save(kernel_trace_path(args.kernel_trace, rank));
    if (lead)
      std::cout << "ddp-bench: kernel trace of " << traced << " steps in " << args.kernel_trace
                << std::endl;
  }
  if (args.profile) {
    if (pg) {
      trace.write_merged(*pg, args.trace_file);
    } else {
      trace.write(args.trace_file);
    }
    if (lead) std::cerr << "ddp-bench: wrote trace " << args.trace_file << std::endl;
  }
  Memory memory = measure_memory(*w.ptr, *opt, runtime, device, meter.result());
  memory.device_peak = std::max(memory.device_peak, capture_peak);
  if (!args.save_params.empty()) {
    ddp::io::TensorMap out;
    // Collective: every parameter gathered by its layout (sharded, --tp, or both nested).
    const ddp::io::TensorMap whole = ddp::tools::whole_weights(*w.ptr, runtime, split);
    for (auto& [name, p] : named_params(*w.ptr)) out[name] = whole.at(name);
    if (lead) ddp::io::save_safetensors(args.save_params, out);
  }
  if (lead) {
    const Stats s = summarize(step_ms);
    std::string line;
    if (args.json) {
      // Field order is the reference's (bench/reference/torch_ddp.py --json); times rounded to
      // the microsecond, as the text line.
      const auto ms = [](double v) { return std::round(v * 1000.0) / 1000.0; };
      nlohmann::ordered_json result;
      result["model"] = args.model;
      result["world"] = world;
      result["batch"] = args.batch_size;
      result["device"] = args.device;
      result["side"] = "ours";
      result["median_ms"] = ms(s.median);
      result["mean_ms"] = ms(s.mean);
      result["min_ms"] = ms(s.min);
      result["repeat"] = timed;
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
      if (runtime) {
        result["memory"]["gathered_by_owner"] = {
            {"full_params_bytes", memory.peak_by_owner.full_params},
            {"gather_output_bytes", memory.peak_by_owner.gather_output},
            {"reduce_input_bytes", memory.peak_by_owner.reduce_input}};
      }
      line = result.dump();
    } else {
      char text[512];
      std::snprintf(text, sizeof(text),
                    "result model=%s world=%d batch=%lld device=%s side=ours median_ms=%.3f "
                    "mean_ms=%.3f min_ms=%.3f repeat=%d style=%s tp=%lld",
                    args.model.c_str(), world, static_cast<long long>(args.batch_size),
                    args.device.c_str(), s.median, s.mean, s.min, timed,
                    args.shard.chosen ? args.shard.style.c_str() : "none",
                    static_cast<long long>(args.tp));
      line = text;
    }
    std::cout << line << "\n";
    if (args.options.verbose && wrapped) {
      std::cout << ddp::obs::format_summary(wrapped->logging_data());
    }
    if (args.options.verbose) {
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
      if (runtime) {
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
  if (pg) pg->barrier("end of benchmark");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "ddp-bench: step time of a zoo model under a data-parallel style (--style, --tp), ours or "
      "alone (forward, loss, backward, the optimizer step of --optimizer)"};
  ddp::tools::add_run_flags(app, args, args.options.verbose);
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
  ddp::tools::add_ddp_flags(app, args.options);
  ddp::tools::add_comm_hook_flag(app, args.comm_hook);
  ddp::tools::add_recipe_flags(app, args.recipe, {"sgd", "adam", "adamw"});
  app.add_flag("--autocast-bf16", args.autocast_bf16,
               "forward and loss under bf16 autocast (parameters and gradients stay fp32)");
  app.add_flag("--json", args.json, "one JSON object per result");
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
