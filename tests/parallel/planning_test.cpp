#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "ddp/models/registry.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using Model = parallel::DistributedDataParallel<torch::nn::AnyModule>;

// The plan's parameter order: buckets in launch order, parameters in buffer order.
std::vector<std::string> plan_names(Model& m) {
  std::vector<std::string> names;
  for (const auto& b : m.bucket_plan().buckets) {
    for (size_t p : b.params) names.push_back(m.parameter_names()[p]);
  }
  return names;
}

// The order the gradients actually became ready in the last backward.
std::vector<std::string> observed_names(Model& m) {
  const auto tl = m.last_timeline();
  std::vector<size_t> idx(tl.param_ready_ns.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return tl.param_ready_ns[a] < tl.param_ready_ns[b]; });
  std::vector<std::string> names;
  for (size_t i : idx) names.push_back(m.parameter_names()[i]);
  return names;
}

const std::vector<std::string> kReverse = {"fc3.bias",   "fc3.weight", "fc2.bias",
                                           "fc2.weight", "fc1.bias",   "fc1.weight"};

// OutOfOrderNet applies fc3, fc1, fc2: gradients are ready fc2, fc1, fc3. Graph planning buckets
// in that order from iteration 1; without it the plan starts reversed and is rebuilt once.
DDP_TEST_WORKER(planning) {
  auto pg = worker_process_group();
  for (bool planning : {true, false}) {
    auto w = make_test_workload("out-of-order");
    parallel::DDPOptions options;
    options.graph_planning = planning;
    options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
        buckets::mib_bytes(1e-6);  // a bucket per parameter
    Model model(w.module, pg, options);
    require(plan_names(model) == kReverse, "the initial plan must be reverse registration order");
    torch::optim::SGD opt(model.parameters(), 0.05);
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = w.batch(step * 12 + pg->rank() * 4, 4);
      opt.zero_grad();
      w.loss(model(x), y).backward();
      opt.step();
      const auto observed = observed_names(model);
      require(observed != kReverse, "the model's ready order should differ from reverse order");
      if (planning || step >= 1) {
        require(plan_names(model) == observed,
                std::string("plan order differs from the observed order, planning=") +
                    (planning ? "on" : "off") + ", step " + std::to_string(step));
      }
      if (!planning && step == 0) {
        // The rebuild happened at the end of this backward: the plan now follows the observation.
        require(plan_names(model) == observed, "no rebuild after iteration 1");
      }
    }
    require(model.num_plan_changes() == 1, "the plan must change exactly once");
    require(observed_names(model)[0] == "fc2.bias" || observed_names(model)[0] == "fc2.weight",
            "fc2's gradients must be ready first");
  }
}

DDP_WORKER_TEST_PER_WORLD(Planning, PredictedOrderMatchesObservedAndRebuildWorks, planning, 1, 2,
                          3);

// Equivalence with the single-process oracle on the out-of-order model, planning on and off.
DDP_TEST_WORKER(planning_equivalence) {
  auto pg = worker_process_group();
  TrainSpec spec;
  spec.model = "out-of-order";
  spec.steps = 4;
  const TrainResult oracle = train_single(spec, pg->world_size());
  for (bool planning : {true, false}) {
    parallel::DDPOptions options;
    options.graph_planning = planning;
    options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
        buckets::mib_bytes(1e-3);
    const TrainResult got = train_ddp(spec, pg, options);
    require_close(got.names, got.params, oracle.params, 1e-5,
                  std::string("planning ") + (planning ? "on" : "off"));
  }
}

TEST(Planning, EquivalenceAcrossTheRebuild) {
  for (int world : {2, 3}) {
    EXPECT_WORKERS_PASS(run_workers(planning_equivalence, world));
  }
}

// params_to_ignore: the named parameter is neither broadcast nor reduced (rank-local), the others
// are; buffers are never in buckets.
DDP_TEST_WORKER(ignore_and_buffers) {
  auto pg = worker_process_group();
  auto w = make_test_workload("batchnorm");
  {
    torch::NoGradGuard no_grad;
    for (auto& p : w.ptr->parameters()) p.add_(0.5 * pg->rank());
  }
  parallel::DDPOptions options;
  options.params_to_ignore = {"fc2.bias"};
  Model model(w.module, pg, options);
  for (const auto& name : model.parameter_names()) {
    require(name != "fc2.bias", "an ignored parameter is in the reducer");
    require(name.find("running") == std::string::npos, "a buffer is in a bucket");
  }
  require(model.parameter_names().size() == 5, "fc1 (2), bn (2), fc2.weight expected");
  auto [x, y] = w.batch(pg->rank() * 4, 4);
  w.loss(model(x), y).backward();
  const auto named = w.ptr->named_parameters();
  // Closed forms over ranks via all-gather: the ignored bias keeps its per-rank offset and its
  // local gradient; fc2.weight is identical on all ranks.
  auto gather = [&](const torch::Tensor& t) {
    return pg->all_gather_each(t.detach().clone(), "gather");
  };
  const auto bias = gather(named["fc2.bias"]);
  const auto weight = gather(named["fc2.weight"]);
  const auto weight_grad = gather(named["fc2.weight"].grad());
  for (int r = 1; r < pg->world_size(); ++r) {
    require(torch::allclose(bias[r] - bias[0], torch::full_like(bias[0], 0.5 * r)),
            "the ignored parameter was broadcast");
    require(torch::equal(weight[r], weight[0]), "fc2.weight was not broadcast");
    require(torch::equal(weight_grad[r], weight_grad[0]), "fc2.weight's gradient not averaged");
  }
}

TEST(Planning, ParamsToIgnoreAreNeitherBroadcastNorReduced) {
  EXPECT_WORKERS_PASS(run_workers(ignore_and_buffers, 3));
}

DDP_TEST_WORKER(ignore_unknown_name) {
  auto pg = worker_process_group();
  auto w = models::make_workload("net", {8});
  parallel::DDPOptions options;
  options.params_to_ignore = {"fc9.weight"};
  require_error_says([&] { Model model(w.module, pg, options); },
                     {"params_to_ignore names 'fc9.weight', which is not a parameter or buffer"});
}

TEST(Planning, UnknownIgnoredNameIsAnError) {
  EXPECT_WORKERS_PASS(run_workers(ignore_unknown_name, 1));
}

}  // namespace
}  // namespace ddp::testing
