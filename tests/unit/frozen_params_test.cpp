// Frozen parameters (requires_grad false) are taken in once (intake/module_intake.hpp) and left
// alone in every style: after 3 SGD steps at world 1, 2 and 3 they still hold rank 0's initial
// values on every rank (each rank built its model from another seed, so the broadcast is what
// makes them equal), have no gradient, and the trainable parameters equal single-process
// training with the same layer frozen (rel. err < 1e-5). Styles: replicate, fully_shard and
// default through data_parallel, and tensor parallelism with its frozen Linear planned.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/intake/module_intake.hpp"
#include "ddp/models/mlp.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/tp/parallelize.hpp"
#include "support/error_text.hpp"
#include "support/oracle_twin.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

models::MLPOptions frozen_shape() {
  // hidden 6 divides by 2 and 3: DEFAULT shards the hidden layers
  return models::MLPOptions{/*in=*/4, /*hidden=*/6, /*out=*/5, /*depth=*/3};
}

void freeze(torch::nn::Module& module, const std::string& prefix) {
  for (auto& item : module.named_parameters()) {
    if (item.key().rfind(prefix, 0) == 0) item.value().set_requires_grad(false);
  }
}

void require_frozen_untouched(const std::vector<std::pair<std::string, torch::Tensor>>& whole,
                              const torch::nn::Module& oracle, const std::string& prefix,
                              const std::string& context) {
  int frozen = 0;
  for (const auto& [name, t] : whole) {
    if (name.rfind(prefix, 0) != 0) continue;
    ++frozen;
    require(torch::equal(t, oracle.named_parameters()[name]),
            context + ": frozen '" + name + "' changed or is not rank 0's");
  }
  require(frozen == 2, context + ": the frozen layer's weight and bias are listed");
}

struct Case {
  std::string style;
  int world = 1;
  DDP_CASE_FIELDS(style)
};

DDP_TEST_WORKER_WITH(frozen_styles, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto style = shard::parse_style(c.style);
  const auto shape = frozen_shape();
  // Rank r's copy from seed r: rank 0's values must reach every rank.
  OracleTwin<models::MLP> twin(
      [&] {
        models::MLP net(shape);
        freeze(*net, "layers.1.");
        return net;
      },
      w, r);
  DataParallelOptions options;
  options.shard.units = {"layers.0", "layers.1", "layers.2"};
  auto model = data_parallel(twin.net(), pg, style, options);
  twin.regression_steps([&](const torch::Tensor& x) { return model(x); }, 3, 3, shape.in,
                        shape.out);
  for (const auto& item : twin.net()->named_parameters()) {
    if (item.key().rfind("layers.1.", 0) == 0) {
      require(!item.value().grad().defined(), "frozen '" + item.key() + "' got a gradient");
    }
  }
  const auto whole = whole_parameters(model.wrapped());
  const std::string context = std::string("frozen layer, ") + shard::style_name(style);
  require_frozen_untouched(whole, *twin.oracle(), "layers.1.", context);
  twin.require_close(whole, 1e-5, context);
}

void PrintTo(const Case& c, std::ostream* out) { *out << c.style << " world " << c.world; }

DDP_WORKER_CASE_TEST(FrozenParams, KeepTheirValueAndGetNoGradient, frozen_styles, Case);

INSTANTIATE_TEST_SUITE_P(Styles, FrozenParams,
                         ::testing::Values(Case{"replicate", 1}, Case{"replicate", 2},
                                           Case{"replicate", 3}, Case{"fully_shard", 1},
                                           Case{"fully_shard", 2}, Case{"fully_shard", 3},
                                           Case{"default", 2}, Case{"default", 3}));

// Tensor parallelism over the whole group: layers.0 colwise (frozen), layers.1 rowwise.
DDP_TEST_WORKER(frozen_tensor_parallel) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  auto shape = frozen_shape();
  shape.hidden = 12;  // divides by 1, 2 and 3
  shape.depth = 2;
  TwinOptions whole;
  whole.whole_batches = true;  // tp: the same data on every rank
  OracleTwin<models::MLP> twin(
      [&] {
        models::MLP net(shape);
        freeze(*net, "layers.0.");
        return net;
      },
      pg->world_size(), pg->rank(), whole);
  models::MLP& net = twin.net();
  auto tensor_parallel = tp::parallelize_module(
      net.ptr(), pg, {{"layers.0", tp::ColwiseParallel()}, {"layers.1", tp::RowwiseParallel()}});
  twin.regression_steps([&](const torch::Tensor& x) { return net->forward(x); }, 3, 3, shape.in,
                        shape.out);
  for (const auto& item : net->named_parameters()) {
    if (item.key().rfind("layers.0.", 0) == 0) {
      require(!item.value().grad().defined(), "frozen '" + item.key() + "' got a gradient");
    }
  }
  const auto params = whole_parameters(*net, tensor_parallel->sharding());
  require_frozen_untouched(params, *twin.oracle(), "layers.0.", "frozen colwise layer");
  twin.require_close(params, 1e-5, "frozen colwise layer");
}

class FrozenTensorParallel : public ::testing::TestWithParam<int> {};

TEST_P(FrozenTensorParallel, KeepsTheFrozenLinearAndTrainsTheRest) {
  EXPECT_WORKERS_PASS(run_workers(frozen_tensor_parallel, GetParam()));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FrozenTensorParallel, ::testing::Values(1, 2, 3));

struct SharedTwiceImpl : torch::nn::Module {
  SharedTwiceImpl() {
    const torch::nn::Linear shared(2, 2);
    a = register_module("a", shared);
    b = register_module("b", shared);  // the same tensors under a second name: tied
    c = register_module("c", torch::nn::Linear(2, 2));
    bn = register_module("bn", torch::nn::BatchNorm1d(2));
    c->bias.set_requires_grad(false);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

TEST(ModuleIntake, TiedWeightsOnceWithTheirAliasesFrozenAndBuffersListed) {
  SharedTwiceImpl module;
  const auto intake = intake::take_in(module);
  using Names = std::vector<std::string>;
  EXPECT_EQ(intake.names,
            (Names{"a.weight", "a.bias", "c.weight", "c.bias", "bn.weight", "bn.bias"}));
  EXPECT_EQ(intake.aliases, (std::vector<Names>{{"b.weight"}, {"b.bias"}, {}, {}, {}, {}}));
  EXPECT_EQ(intake.trainable_names(),
            (Names{"a.weight", "a.bias", "c.weight", "bn.weight", "bn.bias"}));
  EXPECT_EQ(intake.buffer_names,
            (Names{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_TRUE(intake.params[0].is_same(module.b->weight));
  const auto ignored = intake::take_in(module, {"c.weight", "bn.running_var"});
  EXPECT_EQ(ignored.names, (Names{"a.weight", "a.bias", "c.bias", "bn.weight", "bn.bias"}));
  EXPECT_EQ(ignored.buffer_names, (Names{"bn.running_mean", "bn.num_batches_tracked"}));
  EXPECT_EQ(error_of([&] { intake::take_in(module, {"c.weigth"}); }),
            "ddp: params_to_ignore names 'c.weigth', which is not a parameter or buffer of the "
            "module");
}

}  // namespace
}  // namespace ddp::testing
