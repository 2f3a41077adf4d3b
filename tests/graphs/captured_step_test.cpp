// CapturedStep (graphs/captured_step.hpp). On CPU (CI): the refusal by exact text. On one GPU
// (scripts/gpu-check.sh, stage tests; skipped without CUDA): a whole step captured and replayed
// equals the same steps run eagerly through the same optimizer (optim/sgd.hpp, optim/adam.hpp:
// the same fused kernels, so bit for bit) at world 1 on NCCL: Net bare and under DDP with SGD
// momentum, Adam and AdamW under a warmup-cosine schedule written each step; the zoo's GPT under
// bf16 autocast, DDP and FULLY_SHARD per block; accumulation over 3 micro-batches (no_sync, one
// graph) under DDP and FULLY_SHARD; the whole GPT recipe (AdamW in weight-decay groups, the
// schedule, clipping on the device, 2 micro-batches, bf16) under DDP and FULLY_SHARD, and the same
// with an inf gradient injected at one step, which must equal a run that never took that step
// (parameters and optimizer state untouched on the device, the skip counted). A step that syncs
// the host falls back to eager with the warning, still equal; dropout draws new masks per replay.
// Our fused optimizers also stay within rel. err 1e-5 of torch::optim's per-tensor ones.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "ddp/graphs/captured_step.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/optim/adam.hpp"
#include "ddp/optim/grad_clip.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "support/error_text.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

TEST(CapturedStepRefuses, ACpuDevice) {
  EXPECT_EQ(error_of([] { graphs::CapturedStep step([] {}, torch::Device(torch::kCPU)); }),
            "ddp: a captured step (--cuda-graph) needs a CUDA device, not cpu: CUDA graphs "
            "capture GPU work only");
}

// A replay reads fixed shapes: another count or shape of batch is named, input and shapes.
TEST(CapturedStepRefuses, ABatchOfAnotherShape) {
  const std::vector<torch::Tensor> inputs = {torch::zeros({16, 256}), torch::zeros({16})};
  EXPECT_EQ(graphs::batch_mismatch(inputs, {torch::ones({16, 256}), torch::ones({16})}), "");
  EXPECT_EQ(graphs::batch_mismatch(inputs, {torch::ones({16, 256})}),
            "1 batch tensors given, but the step reads 2 inputs");
  EXPECT_EQ(graphs::batch_mismatch(inputs, {torch::ones({16, 256}), torch::ones({8})}),
            "input 1 has shape [8], but the captured step reads [16]: a replay reads fixed shapes "
            "(pad the last partial batch or drop it, or make one CapturedStep per shape)");
  // The dtype may differ: copy_ converts (token ids read as int64 from an int32 host batch).
  EXPECT_EQ(
      graphs::batch_mismatch(inputs, {torch::ones({16, 256}, torch::kInt), torch::ones({16})}), "");
}

constexpr int kWarmup = 3;
constexpr int kSteps = 12;

// Ours: one implementation for eager and captured steps. "recipe": AdamW in the GPT recipe's
// weight-decay groups.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        std::vector<torch::Tensor> params) {
  if (kind == "sgd") {
    return std::make_unique<optim::Sgd>(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  if (kind == "recipe") {
    const auto o = torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1);
    return std::make_unique<optim::AdamW>(optim::weight_decay_groups(params, o), o);
  }
  if (kind == "adamw") {
    return std::make_unique<optim::AdamW>(params,
                                          torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  }
  return std::make_unique<optim::Adam>(params, torch::optim::AdamOptions(1e-3));
}

// A warmup-then-cosine schedule: what a replay must follow through the device scalar.
double schedule(int step) {
  const double peak = 1e-3;
  if (step < 4) return peak * (step + 1) / 4;
  return 1e-4 + 0.5 * (peak - 1e-4) * (1 + std::cos(M_PI * (step - 4) / (kSteps - 4)));
}

struct Config {
  std::string model = "net";   // a models/registry.hpp workload
  std::string style = "bare";  // bare, ddp or fsdp (FULLY_SHARD per wrap unit)
  std::string optimizer = "sgd";
  int micro_batches = 1;  // > 1: no_sync for all but the last, in one step
  bool autocast_bf16 = false;
  bool sync_in_step = false;  // a host sync inside the step: the capture must fall back
  double clip = 0;            // > 0: the total gradient norm clipped on the device (skip policy)
  int inject_inf_at = -1;     // >= 0: the loss times inf at this step (an inf gradient)
  int leave_out = -1;         // >= 0: the eager oracle of an injection: this step not run at all
  bool eager_torch_optim = false;  // the eager run's optimizer is torch::optim's (rel. err 1e-5)
  std::string describe() const {
    return style + " " + model + " " + optimizer + (micro_batches > 1 ? " accumulating" : "") +
           (autocast_bf16 ? " bf16" : "") + (clip > 0 ? " clipped" : "") +
           (inject_inf_at >= 0 ? " inf at step " + std::to_string(inject_inf_at) : "");
  }
};

// The whole GPT recipe on the zoo's small GPT: AdamW in weight-decay groups under the schedule,
// clip 1.0 on the device, 2 micro-batches, bf16 autocast.
Config gpt_recipe(const std::string& style) {
  Config c;
  c.model = "gpt";
  c.style = style;
  c.optimizer = "recipe";
  c.autocast_bf16 = true;
  c.micro_batches = 2;
  c.clip = 1.0;
  return c;
}

struct Result {
  std::vector<torch::Tensor> params;  // whole, on the CPU
  graphs::CapturedStep::State state = graphs::CapturedStep::State::kWarmingUp;
  int64_t steps_taken = -1;    // the optimizer's device count (ours only)
  int64_t skipped_steps = -1;  // the clipper's device count (with clip)
};

// kSteps steps of `config` on the GPU, captured (CapturedStep) or eager; the batches are refilled
// into static tensors before each step. Returns the final whole parameters.
// The eager side's optimizer: torch::optim's, with the same hyperparameters; the captured side
// runs the capturable one, so each comparison also checks optim/capturable against torch::optim.
std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const std::string& kind,
                                                              std::vector<torch::Tensor> params) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(params,
                                               torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  if (kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  }
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
}

void set_torch_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

Result train(const Config& config, bool captured, comm::ProcessGroupPtr pg) {
  models::WorkloadOptions wo;
  wo.dim = config.model == "net" ? 64 : 0;
  models::Workload w = models::make_workload(config.model, wo);
  w.ptr->to(torch::kCUDA);
  std::optional<DataParallel<torch::nn::AnyModule>> wrapped;
  if (config.style != "bare") {
    DataParallelOptions options;
    options.shard.units = w.wrap_units;
    wrapped.emplace(
        w.module, pg,
        config.style == "ddp" ? DataParallelStyle::kReplicate : DataParallelStyle::kFullyShard,
        std::move(options));
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<torch::optim::Optimizer> torch_opt;
  if (captured || !config.eager_torch_optim) {
    opt = make_optimizer(config.optimizer, w.ptr->parameters());
  } else {
    torch_opt = make_torch_optimizer(config.optimizer, w.ptr->parameters());
  }
  std::optional<optim::GradClipper> clipper;
  if (config.clip > 0) {
    optim::ClipOptions clip;
    clip.max_norm = config.clip;
    clip.non_finite = optim::NonFinite::kSkip;
    clipper.emplace(clip, torch::Device(torch::kCUDA), /*first_step=*/0);
    dynamic_cast<optim::DeviceStep&>(*opt).skip_when(clipper->skip_flag());
  }
  // The loss's factor: 1, or inf at the injected step (written between replays).
  const auto scale = torch::ones({}, torch::kCUDA);
  const int64_t batch = 8;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> inputs;  // static, one per micro-batch
  for (int m = 0; m < config.micro_batches; ++m) {
    auto [x, y] = w.batch(0, batch);
    inputs.emplace_back(x.to(torch::kCUDA), y.to(torch::kCUDA));
  }
  const auto micro_step = [&](int m) {
    std::optional<parallel::AutocastGuard> autocast;
    if (config.autocast_bf16) autocast.emplace(torch::kCUDA, torch::kBFloat16);
    const auto& [x, y] = inputs[static_cast<size_t>(m)];
    return w.loss(wrapped ? (*wrapped)(x) : w.module.forward(x), y) * scale / config.micro_batches;
  };
  const auto body = [&] {
    // Dropped (the backward makes them in the graph's pool; DDP's reducer copies them into its
    // buckets, a sharded unit's reduced shard becomes them), as the tools' captured steps do.
    if (opt) {
      optim::zero_grad(*opt, /*set_to_none=*/true);
    } else {
      torch::NoGradGuard no_grad;
      for (auto& p : w.ptr->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
    for (int m = 0; m + 1 < config.micro_batches; ++m) {
      TORCH_CHECK(wrapped, "accumulation is tested under a wrapper");
      const auto guard = wrapped->no_sync();
      micro_step(m).backward();
    }
    const auto loss = micro_step(config.micro_batches - 1);
    loss.backward();
    if (clipper) {
      clipper->clip(wrapped ? parallel::grad_shards(*wrapped) : optim::grad_shards(*w.ptr));
    }
    if (opt) {
      opt->step();
    } else {
      torch_opt->step();
    }
    if (config.sync_in_step) (void)loss.item<float>();  // a host sync: cannot be captured
  };
  graphs::CapturedStepOptions options;
  options.warmup_steps = kWarmup;
  std::unique_ptr<graphs::CapturedStep> step;
  if (captured) {
    step = std::make_unique<graphs::CapturedStep>(body, torch::Device("cuda:0"), options);
  }
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < config.micro_batches; ++m) {
      auto [x, y] = w.batch((s * config.micro_batches + m) * batch, batch);
      inputs[static_cast<size_t>(m)].first.copy_(x);
      inputs[static_cast<size_t>(m)].second.copy_(y);
    }
    if (s == config.leave_out) continue;
    scale.fill_(s == config.inject_inf_at ? INFINITY : 1.0);
    if (config.optimizer == "adamw" || config.optimizer == "recipe") {
      if (opt) {
        optim::set_lr(*opt, schedule(s));
      } else {
        set_torch_lr(*torch_opt, schedule(s));
      }
    }
    if (step) {
      step->run();
    } else {
      body();
    }
  }
  Result out;
  if (step) out.state = step->state();
  torch::cuda::synchronize();
  if (opt) out.steps_taken = dynamic_cast<optim::DeviceStep&>(*opt).steps_taken();
  if (clipper) out.skipped_steps = clipper->skipped_steps();
  if (wrapped) {
    for (const auto& [name, p] : whole_parameters(wrapped->wrapped())) out.params.push_back(p);
  } else {
    for (const auto& p : w.ptr->parameters()) out.params.push_back(p.detach().cpu().clone());
  }
  return out;
}

double max_rel_err(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, ((a[i].to(torch::kDouble) - b[i].to(torch::kDouble)).norm() /
                             b[i].to(torch::kDouble).norm())
                                .item<double>());
  }
  return worst;
}

DDP_TEST_WORKER(captured_step_equals_eager) {
  auto pg = worker_process_group(std::chrono::seconds(120), "nccl");
  std::vector<Config> configs;
  for (const std::string style : {"bare", "ddp"}) {
    for (const std::string optimizer : {"sgd", "adam", "adamw"}) {
      Config c;
      c.style = style;
      c.optimizer = optimizer;
      configs.push_back(c);
    }
  }
  for (const std::string style : {"ddp", "fsdp"}) {
    Config gpt;  // the zoo's small GPT under bf16 autocast, FULLY_SHARD per block
    gpt.model = "gpt";
    gpt.style = style;
    gpt.optimizer = "adamw";
    gpt.autocast_bf16 = true;
    configs.push_back(gpt);
    Config mlp;  // accumulation over 3 micro-batches, one graph
    mlp.model = "mlp";
    mlp.style = style;
    mlp.micro_batches = 3;
    configs.push_back(mlp);
    configs.push_back(gpt_recipe(style));
  }
  for (const Config& c : configs) {
    const Result eager = train(c, false, pg);
    const Result captured = train(c, true, pg);
    require(
        captured.state == graphs::CapturedStep::State::kReplaying,
        c.describe() + ": the step was not captured (" + graphs::state_name(captured.state) + ")");
    require(captured.params.size() == eager.params.size(), c.describe() + ": parameter count");
    const double err = max_rel_err(captured.params, eager.params);
    std::cerr << c.describe() << ": captured vs eager max relative error " << err << std::endl;
    const double bound = 0;  // the same optimizer, the same kernels: bitwise
    require(err <= bound, c.describe() + ": captured differs from eager by " + std::to_string(err));
    // The runs trained: the comparison is not between two untouched models.
    models::WorkloadOptions wo;
    wo.dim = c.model == "net" ? 64 : 0;
    const auto initial = models::make_workload(c.model, wo).ptr->parameters();
    double moved = 0;
    for (size_t i = 0; i < initial.size() && i < eager.params.size(); ++i) {
      if (initial[i].sizes() != eager.params[i].sizes()) continue;
      moved = std::max(moved, (eager.params[i] - initial[i]).abs().max().item<double>());
    }
    require(moved > 1e-4, c.describe() + ": the parameters did not move");
    if (c.clip > 0) {
      require(captured.steps_taken == kSteps && captured.skipped_steps == 0,
              c.describe() + ": " + std::to_string(captured.steps_taken) + " steps taken, " +
                  std::to_string(captured.skipped_steps) + " skipped");
    }
  }
  // An inf gradient at step 5 of the recipe, captured: the step is dropped on the device, so the
  // run equals (bit for bit) an eager run that never took step 5, and the drop is counted.
  for (const std::string style : {"ddp", "fsdp"}) {
    Config recipe = gpt_recipe(style);
    Config oracle = recipe;
    oracle.leave_out = 5;
    recipe.inject_inf_at = 5;
    const Result without = train(oracle, false, pg);
    const Result injected = train(recipe, true, pg);
    const double err = max_rel_err(injected.params, without.params);
    std::cerr << recipe.describe() << ": vs a run without that step " << err << std::endl;
    require(injected.state == graphs::CapturedStep::State::kReplaying,
            recipe.describe() + ": not captured");
    require(err == 0, recipe.describe() + ": differs from the run without that step by " +
                          std::to_string(err));
    require(injected.skipped_steps == 1 && injected.steps_taken == kSteps - 1,
            recipe.describe() + ": " + std::to_string(injected.steps_taken) + " steps taken, " +
                std::to_string(injected.skipped_steps) + " skipped");
  }
  // Our fused optimizers against torch::optim's per-tensor ones, eagerly on the GPU.
  for (const std::string optimizer : {"sgd", "adam", "adamw"}) {
    Config c;
    c.style = "ddp";
    c.optimizer = optimizer;
    Config theirs = c;
    theirs.eager_torch_optim = true;
    const double err = max_rel_err(train(c, false, pg).params, train(theirs, false, pg).params);
    std::cerr << "fused " << optimizer << " vs torch::optim: " << err << std::endl;
    require(err < 1e-5,
            "fused " + optimizer + " differs from torch::optim by " + std::to_string(err));
  }
}

DDP_TEST_WORKER(captured_step_fallback) {
  auto pg = worker_process_group(std::chrono::seconds(120), "nccl");
  Config c;
  c.style = "ddp";
  c.sync_in_step = true;
  const Result eager = train(c, false, pg);
  ::testing::internal::CaptureStderr();
  const Result fallback = train(c, true, pg);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  require(fallback.state == graphs::CapturedStep::State::kEager, "a host sync falls back to eager");
  const std::string want =
      "[ddp rank 0] ddp: warning: the step could not be captured in a CUDA graph, so it runs "
      "eagerly from now on: ";
  // The warning, then the reason: CUDA's text for a sync of a capturing stream.
  const std::string first_line = warning.substr(0, warning.find('\n'));
  require(first_line == want + "CUDA error: operation not permitted when stream is capturing",
          "the fallback warning, got: '" + warning + "'");
  require(max_rel_err(fallback.params, eager.params) < 1e-6,
          "the eager fallback equals eager training");
}

DDP_TEST_WORKER(captured_step_dropout) {
  const auto ones = torch::ones({4096}, torch::kCUDA);
  const auto out = torch::zeros({4096}, torch::kCUDA);
  graphs::CapturedStepOptions options;
  options.warmup_steps = 1;
  graphs::CapturedStep step([&] { out.copy_(torch::dropout(ones, 0.5, true)); },
                            torch::Device("cuda:0"), options);
  step.run();  // warm-up
  step.run();  // capture and first replay
  const auto first = out.cpu().clone();
  step.run();  // second replay
  const auto second = out.cpu().clone();
  require(step.state() == graphs::CapturedStep::State::kReplaying, "dropout captured");
  require(!torch::equal(first, second), "dropout draws a new mask on every replay");
  const double kept = (second > 0).sum().item<double>() / 4096;
  require(kept > 0.4 && kept < 0.6, "about half kept: " + std::to_string(kept));
}

// What a replay cannot repeat is refused by name: DDP's find_unused_parameters without
// static_graph at the capture (an error with error_on_fallback), and a batch of another shape.
DDP_TEST_WORKER(captured_step_refusals) {
  auto pg = worker_process_group(std::chrono::seconds(120), "nccl");
  models::WorkloadOptions wo;
  wo.dim = 64;
  models::Workload w = models::make_workload("net", wo);
  w.ptr->to(torch::kCUDA);
  DataParallelOptions options;
  options.ddp.gradients.find_unused_parameters = true;
  DataParallel<torch::nn::AnyModule> wrapped(w.module, pg, DataParallelStyle::kReplicate, options);
  const auto opt = make_optimizer("sgd", w.ptr->parameters());
  const auto batch = w.batch(0, 8);
  const torch::Tensor x_cpu = batch.first, y_cpu = batch.second;  // a lambda takes no binding
  const torch::Tensor x = x_cpu.to(torch::kCUDA), y = y_cpu.to(torch::kCUDA);
  graphs::CapturedStepOptions o;
  o.warmup_steps = 2;
  o.error_on_fallback = true;
  graphs::CapturedStep step(
      [&] {
        optim::zero_grad(*opt, /*set_to_none=*/false);
        w.loss(wrapped(x), y).backward();
        opt->step();
      },
      {x, y}, torch::Device("cuda:0"), o);
  step.run({x_cpu, y_cpu});
  step.run({x_cpu, y_cpu});
  std::ostringstream shapes;
  shapes << "input 0 has shape " << x_cpu.slice(0, 0, 4).sizes() << ", but the captured step reads "
         << x_cpu.sizes();
  const std::string wrong_shape = error_of([&] { step.run({x_cpu.slice(0, 0, 4), y_cpu}); });
  require(wrong_shape == "ddp: captured step 2: " + shapes.str() +
                             ": a replay reads fixed shapes (pad the last partial batch or drop "
                             "it, or make one CapturedStep per shape)",
          "the batch-shape refusal, got: '" + wrong_shape + "'");
  const std::string refused = error_of([&] { step.run({x_cpu, y_cpu}); });
  require(refused ==
              "ddp: the step could not be captured in a CUDA graph: ddp: DistributedDataParallel "
              "with find_unused_parameters cannot be captured in a CUDA graph: the "
              "used-parameter map is read on the host every step. Set static_graph too (the set "
              "recorded in the first step is replayed), or run eagerly",
          "the find_unused_parameters refusal, got: '" + refused + "'");
}

// The host-side bound on a replay (what c10d's watchdog does not give captured collectives),
// without a dead rank: a replay of 30 fp32 8192^3 products (about 0.6 s on an H100) against a
// 100 ms bound. Run 2 captures and replays (step 1), run 3 queues step 2's replay, run 4 waits for
// step 1's and gives up naming it.
DDP_TEST_WORKER(captured_step_replay_timeout) {
  const auto a = torch::randn({8192, 8192}, torch::kCUDA);
  auto out = torch::empty_like(a);
  graphs::CapturedStepOptions o;
  o.warmup_steps = 1;
  o.replay_timeout = std::chrono::milliseconds(100);
  graphs::CapturedStep step(
      [&] {
        for (int i = 0; i < 30; ++i) at::mm_out(out, a, a);
      },
      torch::Device("cuda:0"), o);
  step.run();  // warm-up
  step.run();  // capture, and the replay of step 1
  step.run();  // the replay of step 2, queued behind it
  const std::string err = error_of([&] { step.run(); });
  require(step.state() == graphs::CapturedStep::State::kReplaying, "the products were captured");
  require(err ==
              "ddp: captured step 3: the replay of captured step 1 did not finish within 100 ms (a "
              "collective inside it waits on a rank that is dead or stopped?)",
          "the replay timeout, got: '" + err + "'");
}

TEST(CapturedStepGpu, EqualsEagerFallsBackAndRedrawsDropout) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Worker<NoCase>* worker :
       {&captured_step_equals_eager, &captured_step_fallback, &captured_step_dropout,
        &captured_step_refusals, &captured_step_replay_timeout}) {
    const auto result = run_workers(*worker, 1);
    EXPECT_TRUE(result.ok()) << worker->name() << ": " << result.describe();
  }
}

}  // namespace
}  // namespace ddp::testing
