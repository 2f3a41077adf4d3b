#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/models/registry.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using Model = parallel::DistributedDataParallel<torch::nn::AnyModule>;

// K steps with the optimizer inside backward equal K steps of the plain path (optimizer after
// backward), for SGD with momentum and for Adam, with several buckets.
DDP_TEST_WORKER(optimizer_overlap) {
  auto pg = worker_process_group();
  for (const std::string kind : {"sgd", "adam"}) {
    auto make =
        [&](const std::vector<torch::Tensor>& params) -> std::unique_ptr<torch::optim::Optimizer> {
      if (kind == "adam") {
        return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
      }
      return std::make_unique<torch::optim::SGD>(params,
                                                 torch::optim::SGDOptions(0.05).momentum(0.9));
    };
    std::vector<std::vector<torch::Tensor>> results;
    for (bool overlap : {false, true}) {
      auto w = models::make_workload("mlp", {24});
      parallel::DDPOptions options;
      options.gradients.buckets.first_bucket_cap_bytes =
          options.gradients.buckets.bucket_cap_bytes =
              buckets::mib_bytes(0.001);  // a bucket per layer
      Model model(w.module, pg, options);
      std::unique_ptr<torch::optim::Optimizer> opt;
      if (overlap) {
        model.set_optimizer_in_backward([&](const torch::Tensor& p) { return make({p}); });
      } else {
        opt = make(model.parameters());
      }
      for (int step = 0; step < 4; ++step) {
        auto [x, y] = w.batch(step * 12 + pg->rank() * 4, 4);
        model.zero_grad();
        w.loss(model(x), y).backward();
        if (opt) opt->step();
      }
      require(model.bucket_plan().buckets.size() > 2, "several buckets expected");
      std::vector<torch::Tensor> params;
      for (const auto& p : model.parameters()) params.push_back(p.detach().clone());
      results.push_back(params);
    }
    require_close(std::vector<std::string>(results[0].size(), kind), results[1], results[0], 1e-6,
                  "optimizer in backward vs after backward");
  }
}

DDP_WORKER_TEST_PER_WORLD(OptimizerOverlap, EqualsThePlainPath, optimizer_overlap, 1, 2, 3);

}  // namespace
}  // namespace ddp::testing
