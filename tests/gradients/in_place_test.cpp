// GradientOptions::reduce_in_place ([Note: in-place reduction]): a bucket whose gradients all
// arrived in tensors of their own is averaged where they are. The parameters after training equal
// the single-process oracle's (plain steps, no_sync accumulation, an unused branch), and a
// reduced gradient is autograd's own tensor, not a view into the bucket's storage.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/models/net.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/bucket_views.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

parallel::DDPOptions in_place_options() {
  parallel::DDPOptions options;
  options.gradients.reduce_in_place = true;
  // Several buckets per model, so the grouped reduction runs per bucket in plan order.
  options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
      buckets::mib_bytes(0.01);
  return options;
}

DDP_TEST_WORKER(in_place_training) {
  auto pg = worker_process_group();
  struct Case {
    std::string model;
    int micro;
    bool find_unused;
  };
  for (const Case& c : {Case{"net", 1, false}, Case{"net", 2, false}, Case{"gpt-tiny", 1, false},
                        Case{"unused-branch", 1, true}, Case{"unused-branch", 2, true}}) {
    TrainSpec spec;
    spec.model = c.model;
    spec.micro_batches = c.micro;
    const TrainResult oracle = train_single(spec, pg->world_size());
    parallel::DDPOptions options = in_place_options();
    options.gradients.find_unused_parameters = c.find_unused;
    const TrainResult got = train_ddp(spec, pg, options);
    require_close(got.names, got.params, oracle.params, 1e-5,
                  "reduce_in_place " + c.model + " micro " + std::to_string(c.micro) + " rank " +
                      std::to_string(pg->rank()));
  }
}

DDP_WORKER_TEST_PER_WORLD(InPlace, TrainsLikeTheOracle, in_place_training, 1, 2, 3);

// After zero_grad(set_to_none) each gradient is a fresh tensor; reduced in place it stays that
// tensor (outside every bucket, whose storage is never allocated) and holds the average of the
// ranks' gradients.
DDP_TEST_WORKER(in_place_grads_stay_put) {
  auto pg = worker_process_group();
  const int w = pg->world_size(), r = pg->rank();
  torch::manual_seed(0);
  models::Net net(64);
  parallel::DistributedDataParallel<models::Net> model(net, pg, in_place_options());
  torch::manual_seed(0);
  models::Net single(64);
  // Rank k's batch is rows [4k, 4k + 4) of one global batch; the oracle's gradient is the mean
  // over the ranks of each batch's gradient.
  const auto global = torch::randn({4 * w, 64});
  const auto x = global.narrow(0, 4 * r, 4);
  for (int k = 0; k < w; ++k) (single->forward(global.narrow(0, 4 * k, 4)).sum() / w).backward();
  for (int step = 0; step < 2; ++step) {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    model(x).sum().backward();
    for (size_t p = 0; p < model.parameters().size(); ++p) {
      require(!grad_in_its_bucket(model, p),
              "grad of " + model.parameter_names()[p] +
                  " was copied into its bucket although reduce_in_place is set");
    }
    // Never needed, the buckets' flat storage was never allocated: the gradients exist once.
    const auto& runtime = parallel::detail::gradients_of(model);
    for (size_t b = 0; b < model.bucket_plan().buckets.size(); ++b) {
      require(!runtime.bucket_buffer(b).defined(),
              "bucket " + std::to_string(b) +
                  " was allocated although every gradient of it "
                  "was reduced in place");
    }
  }
  std::vector<std::string> names;
  std::vector<torch::Tensor> ours, want;
  for (const auto& item : net->named_parameters()) {
    names.push_back(item.key());
    ours.push_back(item.value().grad());
    want.push_back(single->named_parameters()[item.key()].grad());
  }
  require_close(names, ours, want, 1e-5,
                "in place, world " + std::to_string(w) + " rank " + std::to_string(r));
}

TEST_P(InPlace, GradientsStayAutogradsTensors) {
  EXPECT_WORKERS_PASS(run_workers(in_place_grads_stay_put, GetParam()));
}

}  // namespace
}  // namespace ddp::testing
