#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// static_graph on the unused-branch model: the first iteration records the unused set, later ones
// reuse it; the result equals the oracle.
DDP_TEST_WORKER(static_graph) {
  auto pg = worker_process_group();
  TrainSpec spec;
  spec.model = "unused-branch";
  spec.steps = 4;
  const TrainResult oracle = train_single(spec, pg->world_size());
  parallel::DDPOptions options;
  options.gradients.static_graph = true;
  const TrainResult got = train_ddp(spec, pg, options);
  require_close(got.names, got.params, oracle.params, 1e-5, "static_graph");
}

DDP_WORKER_TEST_PER_WORLD(StaticGraph, MatchesTheOracle, static_graph, 1, 2, 3);

// A module whose branch is switched on after the first iteration.
struct Switchable : torch::nn::Module {
  Switchable() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return use_b ? b(a(x)) : a(x); }
  torch::nn::Linear a{nullptr}, b{nullptr};
  bool use_b = false;
};

DDP_TEST_WORKER(static_graph_changes) {
  auto pg = worker_process_group();
  auto module = std::make_shared<Switchable>();
  parallel::DDPOptions options;
  options.gradients.static_graph = true;
  parallel::DistributedDataParallel<std::shared_ptr<Switchable>> model(module, pg, options);
  auto x = torch::randn({2, 4});
  model(x).sum().backward();  // iteration 1: b unused, recorded
  module->use_b = true;
  require_error_says([&] { model(x).sum().backward(); },
                     {"static_graph is set, but parameter 'b.",
                      "although it was unused in the first iteration: the graph changed"});
}

TEST(StaticGraph, AChangedGraphIsAnError) {
  EXPECT_WORKERS_PASS(run_workers(static_graph_changes, 2));
}

}  // namespace
}  // namespace ddp::testing
