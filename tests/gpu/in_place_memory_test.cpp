// In-place reduction on NCCL ([Note: in-place reduction]) keeps each gradient once, as training
// without DDP does: after zero_grad(set_to_none) the device holds exactly what it held before the
// step (nothing keeps a reduced gradient alive: no bucket storage, no collective's work held by a
// watchdog), and a step's peak is the bare model's peak, not one gradient copy more. Run on the
// device machine by scripts/gpu-check.sh; skipped without CUDA or enough GPUs, as on CI.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "ddp/models/net.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kWidth = 1024;  // four Linear(1024) layers: 16.8 MB of fp32 gradients

int64_t parameter_bytes(torch::nn::Module& m) {
  int64_t bytes = 0;
  for (const auto& p : m.parameters()) bytes += p.numel() * p.element_size();
  return bytes;
}

// Allocated bytes at rest (everything the step made is gone) and the step's peak, after `steps`
// steps of forward, backward and zero_grad(set_to_none) on `forward`.
struct StepMemory {
  int64_t at_rest = 0;
  int64_t peak = 0;
};

template <typename Forward>
StepMemory measure(const torch::Device& device, torch::nn::Module& net, Forward forward) {
  const auto x = torch::randn({256, kWidth}, device);
  StepMemory m;
  for (int step = 0; step < 3; ++step) {
    torch::cuda::synchronize(device.index());
    obs::reset_device_peak(device);
    forward(x).square().mean().backward();
    for (auto& p : net.parameters()) p.mutable_grad() = torch::Tensor();
    torch::cuda::synchronize(device.index());
    m.at_rest = obs::device_allocated_bytes(device);
    m.peak = obs::device_peak_allocated_bytes(device);
  }
  return m;
}

DDP_TEST_WORKER(in_place_memory) {
  auto pg = worker_process_group(std::chrono::seconds(120), "nccl");
  const char* local_rank = std::getenv("LOCAL_RANK");
  const torch::Device device(torch::kCUDA, local_rank ? std::atoi(local_rank) : 0);
  torch::manual_seed(0);
  models::Net bare(kWidth);
  bare->to(device);
  const int64_t params = parameter_bytes(*bare);
  const StepMemory alone =
      measure(device, *bare, [&](const torch::Tensor& x) { return bare->forward(x); });

  models::Net net(kWidth);
  net->to(device);
  parallel::DDPOptions options;
  options.gradients.reduce_in_place = true;
  parallel::DistributedDataParallel<models::Net> model(net, pg, options);
  const StepMemory ddp = measure(device, *net, [&](const torch::Tensor& x) { return model(x); });
  const std::string ctx = "rank " + std::to_string(pg->rank()) + "/" +
                          std::to_string(pg->world_size()) + ": parameters " +
                          std::to_string(params) + " B; bare at rest " +
                          std::to_string(alone.at_rest) + ", peak " + std::to_string(alone.peak) +
                          "; DDP in place at rest " + std::to_string(ddp.at_rest) + ", peak " +
                          std::to_string(ddp.peak);
  std::cerr << ctx << std::endl;
  // Both models live on the device now: at rest DDP adds its own parameters and a few small
  // tensors of its own (the unused-parameter map, scalars), never a gradient's worth.
  const int64_t slack = 64 * 1024;
  require(ddp.at_rest - alone.at_rest <= params + slack,
          ctx + ": something still holds reduced gradients after zero_grad(set_to_none)");
  require(ddp.peak - alone.peak <= params + slack,
          ctx + ": a step's peak holds more than the bare model's (a gradient copy more?)");
}

class InPlaceMemory : public ::testing::TestWithParam<int> {};

TEST_P(InPlaceMemory, GradientsExistOnce) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (static_cast<int>(torch::cuda::device_count()) < GetParam()) {
    GTEST_SKIP() << "needs " << GetParam() << " GPUs, found " << torch::cuda::device_count();
  }
  EXPECT_WORKERS_PASS(run_workers(in_place_memory, GetParam(), {}, {{"NCCL_NVLS_ENABLE", "0"}},
                                  std::chrono::seconds(120)));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, InPlaceMemory, ::testing::Values(1, 2, 4), world_name);

}  // namespace
}  // namespace ddp::testing
