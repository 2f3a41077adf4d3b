#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/models/registry.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using Model = parallel::DistributedDataParallel<torch::nn::AnyModule>;
constexpr int kBase = 2;       // batches every rank has; rank r has r more
constexpr int64_t kShard = 4;  // samples per rank per step

// Step t is taken by the ranks with more than t batches; sample offsets are (t, r)-unique.
int64_t offset(int step, int rank) { return (step * 8 + rank) * kShard; }

DDP_TEST_WORKER(join) {
  auto pg = worker_process_group();
  const int world = pg->world_size();
  for (bool initial : {true, false}) {
    // Oracle: one model; at step t the loss is the sum over active ranks of their shard losses,
    // divided by the chosen divisor (the world size, or the number of active ranks).
    auto oracle = models::make_workload("mlp", {16});
    auto oracle_opt = make_test_optimizer("sgd", oracle.ptr->parameters(), 0.05);
    for (int t = 0; t < kBase + world - 1; ++t) {
      oracle_opt->zero_grad();
      const int active = world - std::max(0, t - kBase + 1);
      torch::Tensor loss = torch::zeros({});
      for (int r = world - active; r < world; ++r) {
        auto [x, y] = oracle.batch(offset(t, r), kShard);
        loss = loss + oracle.loss(oracle.module.forward(x), y);
      }
      (loss / (initial ? world : active)).backward();
      oracle_opt->step();
    }

    auto w = models::make_workload("mlp", {16});
    parallel::DDPOptions options;
    options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
        buckets::mib_bytes(0.002);
    Model model(w.module, pg, options);
    auto opt = make_test_optimizer("sgd", model.parameters(), 0.05);
    parallel::JoinOptions join;
    join.divide_by_initial_world_size = initial;
    model.join(
        [&] {
          for (int t = 0; t < kBase + pg->rank(); ++t) {
            auto [x, y] = w.batch(offset(t, pg->rank()), kShard);
            opt->zero_grad();
            w.loss(model(x), y).backward();
            opt->step();
          }
        },
        join);
    require_close_by_name(
        whole_parameters(model), *oracle.ptr, 1e-5,
        std::string("join, divide by ") + (initial ? "initial world" : "active ranks"));
  }
}

DDP_WORKER_TEST_PER_WORLD(Join, UnevenInputsMatchTheOracleForBothDivisors, join, 1, 2, 3);

}  // namespace
}  // namespace ddp::testing
