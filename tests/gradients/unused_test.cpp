#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/models/registry.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// UnusedBranchNet's "unused" Linear takes no part in forward. With find_unused_parameters the
// used parameters match the oracle, and the unused ones end as PyTorch leaves them: no gradient
// (undefined) and unchanged values, on every rank.
DDP_TEST_WORKER(unused_branch) {
  auto pg = worker_process_group();
  for (bool view : {true, false}) {
    for (int micro : {1, 2}) {
      TrainSpec spec;
      spec.model = "unused-branch";
      spec.micro_batches = micro;
      const TrainResult oracle = train_single(spec, pg->world_size());
      parallel::DDPOptions options;
      options.gradients.find_unused_parameters = true;
      options.gradients.gradient_as_bucket_view = view;
      options.gradients.buckets.first_bucket_cap_bytes =
          options.gradients.buckets.bucket_cap_bytes = buckets::mib_bytes(1e-6);
      const TrainResult got = train_ddp(spec, pg, options);
      const std::string ctx = "unused-branch view=" + std::to_string(view) +
                              " micro=" + std::to_string(micro) + " rank " +
                              std::to_string(pg->rank());
      // The oracle's unused parameters keep their init, which is rank 0's after the broadcast.
      require_close(got.names, got.params, oracle.params, 1e-5, ctx);
    }
  }
  // The gradient state of a parameter no rank used.
  auto w = make_test_workload("unused-branch");
  parallel::DDPOptions options;
  options.gradients.find_unused_parameters = true;
  parallel::DistributedDataParallel<torch::nn::AnyModule> model(w.module, pg, options);
  auto [x, y] = w.batch(pg->rank() * 4, 4);
  w.loss(model(x), y).backward();
  for (const auto& item : w.ptr->named_parameters()) {
    const bool unused = item.key().rfind("unused.", 0) == 0;
    require(item.value().grad().defined() == !unused,
            item.key() + ": gradient defined-ness is wrong after a backward that skipped it");
  }
}

DDP_WORKER_TEST_PER_WORLD(Unused, UnusedBranchWithFindUnusedParameters, unused_branch, 1, 2, 3);

// The used-parameter map is all-reduced every iteration next to the buckets; over several steps
// the collectives must stay matched and the result exact.
DDP_TEST_WORKER(find_unused_many_steps) {
  auto pg = worker_process_group();
  TrainSpec spec;
  spec.model = "unused-branch";
  spec.steps = 6;
  parallel::DDPOptions options;
  options.gradients.find_unused_parameters = true;
  const TrainResult oracle = train_single(spec, pg->world_size());
  const TrainResult got = train_ddp(spec, pg, options);
  require_close(got.names, got.params, oracle.params, 1e-5, "six steps");
}

TEST(Unused, ManyStepsStayInStep) { EXPECT_WORKERS_PASS(run_workers(find_unused_many_steps, 3)); }

}  // namespace
}  // namespace ddp::testing
