// CapturedStep (graphs/captured_step.hpp). On CPU (CI): the refusal by exact text. On one GPU
// (scripts/gpu-check.sh, stage tests; skipped without CUDA): a whole step captured and replayed
// equals the same steps run eagerly, bare and under DDP at world 1 on NCCL, with capturable SGD
// momentum, Adam and AdamW under a learning-rate schedule written each step; a step that syncs
// the host falls back to eager with the warning, still equal; dropout draws new masks per replay.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "ddp/graphs/captured_step.hpp"
#include "ddp/models/net.hpp"
#include "ddp/optim/capturable.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

TEST(CapturedStepRefuses, ACpuDevice) {
  EXPECT_EQ(error_of([] { graphs::CapturedStep step([] {}, torch::Device(torch::kCPU)); }),
            "ddp: a captured step (--cuda-graph) needs a CUDA device, not cpu: CUDA graphs "
            "capture GPU work only");
}

constexpr int64_t kDim = 64;
constexpr int64_t kBatch = 32;
constexpr int kWarmup = 3;
constexpr int kSteps = 12;

std::unique_ptr<optim::CapturableOptimizer> make_optimizer(const std::string& kind,
                                                           std::vector<torch::Tensor> params) {
  if (kind == "sgd") {
    optim::CapturableSgdOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    return std::make_unique<optim::CapturableSgd>(std::move(params), o);
  }
  optim::CapturableAdamOptions o;
  o.lr = 1e-3;
  o.decoupled_weight_decay = kind == "adamw";
  o.weight_decay = kind == "adamw" ? 1e-2 : 0;
  return std::make_unique<optim::CapturableAdam>(std::move(params), o);
}

// A warmup-then-cosine schedule: what a replay must follow through the device scalar.
double schedule(int step) {
  const double peak = 1e-3;
  if (step < 4) return peak * (step + 1) / 4;
  return 1e-4 + 0.5 * (peak - 1e-4) * (1 + std::cos(M_PI * (step - 4) / (kSteps - 4)));
}

// kSteps steps of Net on the GPU, captured (CapturedStep) or eager, with or without DDP; the
// batches are refilled into static tensors before each step. Returns the final parameters.
std::vector<torch::Tensor> train(const std::string& kind, bool ddp, bool captured,
                                 bool sync_in_step, comm::ProcessGroupPtr pg,
                                 graphs::CapturedStep::State* end_state = nullptr) {
  torch::manual_seed(0);
  models::Net net(kDim);
  net->to(torch::kCUDA);
  std::unique_ptr<DistributedDataParallel<models::Net>> wrapped;
  if (ddp) wrapped = std::make_unique<DistributedDataParallel<models::Net>>(net, pg);
  auto opt = make_optimizer(kind, net->parameters());
  const auto x = torch::zeros({kBatch, kDim}, torch::kCUDA);
  const auto y = torch::zeros({kBatch, kDim}, torch::kCUDA);
  const auto body = [&] {
    opt->zero_grad();
    const auto out = wrapped ? (*wrapped)(x) : net->forward(x);
    const auto loss = torch::mse_loss(out, y);
    loss.backward();
    opt->step();
    if (sync_in_step) (void)loss.item<float>();  // a host sync: cannot be captured
  };
  graphs::CapturedStepOptions options;
  options.warmup_steps = kWarmup;
  std::unique_ptr<graphs::CapturedStep> step;
  if (captured)
    step = std::make_unique<graphs::CapturedStep>(body, torch::Device("cuda:0"), options);
  for (int s = 0; s < kSteps; ++s) {
    torch::manual_seed(100 + s);
    x.copy_(torch::randn({kBatch, kDim}));
    y.copy_(torch::randn({kBatch, kDim}));
    if (kind == "adamw") opt->set_lr(schedule(s));
    if (step) {
      step->run();
    } else {
      body();
    }
  }
  if (end_state != nullptr && step) *end_state = step->state();
  torch::cuda::synchronize();
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

double max_rel_err(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, ((a[i] - b[i]).norm() / b[i].norm()).item<double>());
  }
  return worst;
}

DDP_TEST_WORKER(captured_step_equals_eager) {
  auto pg = worker_process_group(std::chrono::seconds(120), "nccl");
  for (const bool ddp : {false, true}) {
    for (const std::string kind : {"sgd", "adam", "adamw"}) {
      const auto eager = train(kind, ddp, false, false, pg);
      graphs::CapturedStep::State state{};
      const auto captured = train(kind, ddp, true, false, pg, &state);
      const std::string what = std::string(ddp ? "ddp " : "bare ") + kind;
      require(state == graphs::CapturedStep::State::kReplaying,
              what + ": the step was not captured (" + graphs::state_name(state) + ")");
      const double err = max_rel_err(captured, eager);
      std::cerr << what << ": captured vs eager max relative error " << err << std::endl;
      require(err < 1e-6, what + ": captured differs from eager by " + std::to_string(err));
    }
  }
}

DDP_TEST_WORKER(captured_step_fallback) {
  auto pg = worker_process_group(std::chrono::seconds(120), "nccl");
  const auto eager = train("sgd", true, false, true, pg);
  graphs::CapturedStep::State state{};
  ::testing::internal::CaptureStderr();
  const auto fallback = train("sgd", true, true, true, pg, &state);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  require(state == graphs::CapturedStep::State::kEager, "a host sync falls back to eager");
  const std::string want =
      "[ddp rank 0] ddp: warning: the step could not be captured in a CUDA graph, so it runs "
      "eagerly from now on: ";
  require(warning.rfind(want, 0) == 0, "the fallback warning, got: '" + warning + "'");
  require(max_rel_err(fallback, eager) < 1e-6, "the eager fallback equals eager training");
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

TEST(CapturedStepGpu, EqualsEagerFallsBackAndRedrawsDropout) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* worker :
       {"captured_step_equals_eager", "captured_step_fallback", "captured_step_dropout"}) {
    const auto result = run_workers(worker, 1);
    EXPECT_TRUE(result.ok()) << worker << ": " << result.describe();
  }
}

}  // namespace
}  // namespace ddp::testing
