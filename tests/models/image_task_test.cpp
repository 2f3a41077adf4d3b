// resnet-small's task (models/src/tasks.cpp, add_image_class_task): learnable at the workload's
// own learning rate. One process, SGD at Workload::lr with ddp-train's momentum, fresh samples
// every step; afterwards the
// model classifies samples it never saw far better than chance (1 in 10).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/models/registry.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "support/workers.hpp"

namespace ddp::models {
namespace {

TEST(ImageTask, ResNetSmallLearnsItAtItsDefaultRate) {
  WorkloadOptions options;
  options.dim = 8;  // ResNet-18's shape at width 8: seconds on a CPU
  Workload w = make_workload("resnet-small", options);
  torch::optim::SGD opt(w.ptr->parameters(),
                        torch::optim::SGDOptions(w.lr).momentum(0.9));  // ddp-train's
  constexpr int64_t kBatch = 16;
  constexpr int kSteps = 80;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = w.batch(step * kBatch, kBatch);
    opt.zero_grad();
    w.loss(w.module.forward(x), y).backward();
    opt.step();
  }
  torch::NoGradGuard no_grad;
  const auto [x, y] = w.batch(1'000'000, 200);  // never trained on
  w.ptr->eval();
  const double accuracy =
      w.module.forward(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.8);
  // Every class occurs: the labels are drawn per sample, uniformly.
  EXPECT_EQ(std::get<0>(at::_unique(y)).numel(), 10);
}

// A sample is the same whichever batch it is drawn in.
TEST(ImageTask, ASampleDoesNotDependOnItsBatch) {
  WorkloadOptions options;
  options.dim = 8;
  Workload w = make_workload("resnet-small", options);
  const auto [x, y] = w.batch(10, 6);
  const auto [x1, y1] = w.batch(13, 1);
  EXPECT_TRUE(torch::equal(x1[0], x[3]));
  EXPECT_EQ(y1[0].item<int64_t>(), y[3].item<int64_t>());
}

// --sync-bn (WorkloadOptions::sync_batch_norm) under DDP without buffer broadcasts, each rank on
// its own samples: with it every rank's running statistics are the global batch's, the same on
// every rank; without it each rank keeps its own, as PyTorch's BatchNorm.
DDP_TEST_WORKER(resnet_sync_bn) {
  auto pg = testing::worker_process_group();
  for (const bool sync : {false, true}) {
    WorkloadOptions options;
    options.dim = 4;
    options.sync_batch_norm = sync;
    Workload w = make_workload("resnet-small", options);
    parallel::DataParallelOptions dp_options;
    dp_options.ddp.broadcast_buffers = false;
    parallel::DataParallel<torch::nn::AnyModule> model(w.module, pg, DataParallelStyle::kReplicate,
                                                       dp_options);
    const auto [x, y] = w.batch(8 * pg->rank(), 8);
    w.loss(model(x), y).backward();
    torch::Tensor running_mean;
    for (const auto& b : w.ptr->named_buffers()) {
      if (b.key() == "bn1.running_mean") running_mean = b.value();
    }
    const auto all = pg->all_gather_each(running_mean, "bn1's running mean");
    testing::require(torch::equal(all[0], all[1]) == sync,
                     std::string("--sync-bn ") + (sync ? "on" : "off") +
                         ": the ranks' running statistics " +
                         (sync ? "differ" : "agree on different samples"));
  }
}

TEST(ImageTask, SyncBnSynchronisesTheResNetsStatistics) {
  EXPECT_WORKERS_PASS(testing::run_workers(resnet_sync_bn, 2));
}

}  // namespace
}  // namespace ddp::models
