// SyncBatchNorm (nn/sync_batch_norm.hpp) against one process with torch's BatchNorm on the global
// batch: a conv net under every style at worlds 1-3, local batches uneven and, at world 3, one rank
// with none; one step and ten steps, parameters and running statistics within 1e-5.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/graphs/captured_step.hpp"
#include "ddp/nn/sync_batch_norm.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// Conv -> BatchNorm -> ReLU -> mean over space -> Linear; Norm is torch's or ours (same names,
// same draws in the same order).
template <typename Norm>
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    bn = register_module("bn", Norm(torch::nn::BatchNormOptions(4)));
    head = register_module("head", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head(torch::relu(bn(conv(x))).mean({2, 3}));
  }
  torch::nn::Conv2d conv{nullptr};
  Norm bn{nullptr};
  torch::nn::Linear head{nullptr};
};

template <typename Norm>
std::shared_ptr<ConvNetImpl<Norm>> make_net() {
  torch::manual_seed(7);
  return std::make_shared<ConvNetImpl<Norm>>();
}

constexpr int64_t kGlobal = 7;  // samples in the global batch
constexpr int kSteps = 10;
constexpr double kLr = 0.05;

// Rank r's samples of the global batch: uneven, and rank 1 of 3 or 4 has none.
std::pair<int64_t, int64_t> local_slice(int rank, int world) {
  static const std::map<int, std::vector<int64_t>> sizes = {
      {1, {7}}, {2, {4, 3}}, {3, {4, 0, 3}}, {4, {2, 0, 2, 3}}};
  const auto& s = sizes.at(world);
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += s[static_cast<size_t>(r)];
  return {offset, s[static_cast<size_t>(rank)]};
}

std::pair<torch::Tensor, torch::Tensor> global_batch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({kGlobal, 3, 5, 5}) * 2 + 1, torch::randn({kGlobal, 2})};
}

std::map<std::string, torch::Tensor> values_of(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

void require_close(const std::map<std::string, torch::Tensor>& got,
                   const std::map<std::string, torch::Tensor>& want, double tolerance,
                   const std::string& what) {
  require(got.size() == want.size(), what + ": " + std::to_string(got.size()) +
                                         " values, expected " + std::to_string(want.size()));
  for (const auto& [name, w] : want) {
    const auto& g = got.at(name);
    const double err = (g.to(torch::kDouble) - w.to(torch::kDouble)).abs().max().item<double>() /
                       std::max(1e-12, w.to(torch::kDouble).abs().max().item<double>());
    require(err < tolerance, what + ": " + name + " differs by " + std::to_string(err));
  }
}

// How a run trains: the CPU runs fp32 eager; the GPU adds channels_last, bf16 autocast and a
// captured step (CUDA graphs).
struct Mode {
  std::string name;
  bool channels_last = false;
  bool autocast = false;
  bool captured = false;
  double tolerance = 1e-5;  // fp32; bf16 autocast rounds differently for other batch sizes
};

torch::Device test_device(const std::string& device) {
  if (device == "cpu") return torch::kCPU;
  return torch::Device(torch::kCUDA,
                       static_cast<c10::DeviceIndex>(std::stoi(worker_env("LOCAL_RANK", "0"))));
}

std::map<std::string, torch::Tensor> on_cpu(std::map<std::string, torch::Tensor> values) {
  for (auto& [name, value] : values) value = value.cpu();
  return values;
}

void train_and_compare(const comm::ProcessGroupPtr& pg, shard::DataParallelStyle style,
                       const Mode& mode, const torch::Device& device) {
  const int w = pg->world_size(), r = pg->rank();
  const auto layout = [&](const torch::Tensor& x) {
    return mode.channels_last ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
  };
  const auto autocast = [&](std::optional<parallel::AutocastGuard>& guard) {
    if (mode.autocast) guard.emplace(device.type(), torch::kBFloat16);
  };
  auto oracle = make_net<torch::nn::BatchNorm2d>();
  oracle->to(device);
  auto mine = make_net<nn::SyncBatchNorm2d>();
  mine->to(device);
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(kLr));
  parallel::DataParallel<std::shared_ptr<ConvNetImpl<nn::SyncBatchNorm2d>>> dp(mine, pg, style);
  require(mine->bn->group() == pg, "the wrapper did not bind the SyncBatchNorm to its group");
  optim::Sgd opt(dp.module_ptr()->parameters(), torch::optim::SGDOptions(kLr));
  const auto [offset, count] = local_slice(r, w);
  const auto wrapped_values = [&] {
    std::map<std::string, torch::Tensor> out;
    for (const auto& [name, value] : whole_parameters(dp.wrapped())) out[name] = value;
    for (const auto& b : mine->named_buffers()) out[b.key()] = b.value().detach().clone();
    return on_cpu(out);
  };
  // Static: a replay reads them; refilled before every step.
  const torch::Tensor x = layout(torch::zeros({count, 3, 5, 5}, device));
  const torch::Tensor y = torch::zeros({count, 2}, device);
  const auto body = [&] {
    optim::zero_grad(opt, /*set_to_none=*/true);
    torch::Tensor out;
    {
      std::optional<parallel::AutocastGuard> guard;
      autocast(guard);
      out = dp.forward(x);
    }
    // This rank's samples weighed as the global batch weighs them (the wrapper averages).
    (out.to(torch::kFloat) - y).pow(2).sum().mul(static_cast<double>(w) / kGlobal).backward();
    opt.step();
  };
  std::unique_ptr<graphs::CapturedStep> captured;
  if (mode.captured) {
    graphs::CapturedStepOptions options;
    options.warmup_steps = 3;
    options.error_on_fallback = true;  // a capture that fails says why, here
    options.group = pg;
    captured = std::make_unique<graphs::CapturedStep>(body, device, options);
  }
  const std::string what =
      std::string(shard::style_name(style)) + " " + mode.name + " at world " + std::to_string(w);
  for (int step = 1; step <= kSteps; ++step) {
    const auto [gx, gy] = global_batch(step);
    oracle_opt.zero_grad();
    torch::Tensor want;
    {
      std::optional<parallel::AutocastGuard> guard;
      autocast(guard);
      want = oracle->forward(layout(gx.to(device)));
    }
    (want.to(torch::kFloat) - gy.to(device)).pow(2).sum().div(kGlobal).backward();
    oracle_opt.step();
    x.copy_(gx.narrow(0, offset, count));
    y.copy_(gy.narrow(0, offset, count));
    if (captured) {
      captured->run();
    } else {
      body();
    }
    if (step == 1 || step == kSteps) {
      require_close(wrapped_values(), on_cpu(values_of(*oracle)), mode.tolerance,
                    what + " after step " + std::to_string(step) + ", rank " + std::to_string(r));
    }
  }
  if (captured) {
    require(captured->state() == graphs::CapturedStep::State::kReplaying,
            what + ": not replaying (" + graphs::state_name(captured->state()) + ")");
  }
}

struct StyleWorld {
  std::string style;
  int world;
  std::string device = "cpu";  // or cuda: this rank's GPU, on NCCL
  DDP_CASE_FIELDS(style, device)
};

DDP_TEST_WORKER_WITH(sync_batch_norm_styles, StyleWorld, c) {
  const torch::Device device = test_device(c.device);
  auto pg = worker_process_group(std::chrono::seconds(120), device.is_cuda() ? "nccl" : "gloo");
  const auto style = shard::parse_style(c.style);
  std::vector<Mode> modes{{"fp32"}};
  if (device.is_cuda()) {
    // fp32 means fp32: cuDNN's convolutions default to TF32, whose rounding depends on the batch.
    at::globalContext().setAllowTF32CuDNN(false);
    modes.push_back({"channels_last", true});
    modes.push_back({"bf16 autocast", true, true, false, 2e-2});
    modes.push_back({"captured", false, false, true});
  }
  for (const Mode& mode : modes) train_and_compare(pg, style, mode, device);
}

DDP_WORKER_CASE_TEST(SyncBatchNormStyles, TrainsAsOneProcessWithBatchNormOnTheGlobalBatch,
                     sync_batch_norm_styles, StyleWorld);

INSTANTIATE_TEST_SUITE_P(StylesWorlds, SyncBatchNormStyles,
                         ::testing::Values(StyleWorld{"replicate", 1}, StyleWorld{"replicate", 2},
                                           StyleWorld{"replicate", 3}, StyleWorld{"fully_shard", 2},
                                           StyleWorld{"fully_shard", 3}, StyleWorld{"default", 3}),
                         [](const ::testing::TestParamInfo<StyleWorld>& info) {
                           return info.param.style + "_world" + std::to_string(info.param.world);
                         });

class SyncBatchNormStylesGpu : public ::testing::TestWithParam<StyleWorld> {};

TEST_P(SyncBatchNormStylesGpu, TrainsAsOneProcessWithBatchNormOnTheGlobalBatch) {
  StyleWorld c = GetParam();
  c.device = "cuda";
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (static_cast<int>(torch::cuda::device_count()) < c.world) {
    GTEST_SKIP() << "needs " << c.world << " GPUs, found " << torch::cuda::device_count();
  }
  EXPECT_WORKERS_PASS(run_workers(sync_batch_norm_styles, c.world, c, {{"NCCL_NVLS_ENABLE", "0"}},
                                  std::chrono::seconds(300)));
}

INSTANTIATE_TEST_SUITE_P(StylesWorlds, SyncBatchNormStylesGpu,
                         ::testing::Values(StyleWorld{"replicate", 2}, StyleWorld{"fully_shard", 2},
                                           StyleWorld{"default", 2}, StyleWorld{"replicate", 4},
                                           StyleWorld{"fully_shard", 4}, StyleWorld{"default", 4}),
                         [](const ::testing::TestParamInfo<StyleWorld>& info) {
                           return info.param.style + "_world" + std::to_string(info.param.world);
                         });

// Bound by hand and not wrapped: a training forward gathers the statistics in one collective and
// its backward all-reduces in one; evaluation uses the running statistics and communicates
// nothing. Too few values across the group is refused by name on every rank.
DDP_TEST_WORKER(sync_batch_norm_collectives) {
  auto pg = worker_process_group();
  nn::SyncBatchNorm1d bn(torch::nn::BatchNormOptions(3));
  require(nn::bind_sync_batch_norms(*bn, pg) == 1, "bind_sync_batch_norms bound no module");
  const auto x = torch::randn({2 + pg->rank(), 3}, torch::requires_grad());
  int64_t before = pg->collectives_issued();
  const auto y = bn(x);
  require(pg->collectives_issued() == before + 1, "a training forward is not one collective");
  before = pg->collectives_issued();
  y.pow(2).sum().backward();
  require(pg->collectives_issued() == before + 1, "a backward is not one collective");
  bn->eval();
  before = pg->collectives_issued();
  const auto e = bn(x.detach());
  require(pg->collectives_issued() == before, "evaluation communicated");
  require(torch::allclose(e, torch::batch_norm(x.detach(), bn->weight, bn->bias, bn->running_mean,
                                               bn->running_var, false, 0.1, 1e-5, false)),
          "evaluation does not normalise by the running statistics");
  bn->train();
  std::string error;
  try {
    bn(torch::zeros({pg->rank() == 0 ? 1 : 0, 3}));
  } catch (const c10::Error& err) {
    error = err.what_without_backtrace();
  }
  require(error.rfind("ddp::nn::SyncBatchNorm: expected more than 1 value per channel when "
                      "training, got 1 across the 2 ranks of its group (input size [" +
                          std::string(pg->rank() == 0 ? "1" : "0") + ", 3] on rank " +
                          std::to_string(pg->rank()) + ")",
                      0) == 0,
          "the refusal reads: " + error);
}

TEST(SyncBatchNorm, OneCollectiveEachWayAndNoneInEvaluation) {
  EXPECT_WORKERS_PASS(run_workers(sync_batch_norm_collectives, 2));
}

// Unbound (no group): torch's BatchNorm, bit for bit, running statistics included.
TEST(SyncBatchNorm, UnboundIsTorchsBatchNorm) {
  auto oracle = make_net<torch::nn::BatchNorm2d>();
  auto mine = make_net<nn::SyncBatchNorm2d>();
  const auto [x, y] = global_batch(1);
  EXPECT_TRUE(torch::equal(mine->forward(x), oracle->forward(x)));
  const auto want = values_of(*oracle);
  for (const auto& [name, value] : values_of(*mine)) {
    EXPECT_TRUE(torch::equal(value, want.at(name))) << name;
  }
  EXPECT_EQ(nn::bind_sync_batch_norms(*oracle, nullptr), 0);
}

TEST(SyncBatchNorm, RefusesAnInputOfTheWrongRank) {
  nn::SyncBatchNorm2d bn(torch::nn::BatchNormOptions(3));
  try {
    bn(torch::zeros({2, 3}));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "ddp::nn::SyncBatchNorm2d: expected 4D input (got 2D input)");
  }
}

}  // namespace
}  // namespace ddp::testing
