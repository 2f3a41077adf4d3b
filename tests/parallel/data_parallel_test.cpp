// ddp::data_parallel(module, group or mesh, style): every style through the one entry point, at
// world 1, 2 and 3 on Gloo, equals single-process training on the global batch after 3 steps of
// SGD with momentum (rel. err < 1e-5), also after a forward without backward undone by reshard();
// a 1-D mesh gives its dim, a 2-D mesh without "dp" is refused.

#include "ddp/parallel/data_parallel.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/models/mlp.hpp"
#include "support/error_text.hpp"
#include "support/oracle_twin.hpp"
#include "support/style_runtime.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// One run of a worker below: data_parallel_any_module reads only the style.
struct Case {
  std::string style = "replicate";
  bool mesh = false;  // wrap over a 1-D mesh named "dp" instead of the process group
  int world = 1;
  DDP_CASE_FIELDS(style, mesh)
};

DDP_TEST_WORKER_WITH(data_parallel_styles, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto style = shard::parse_style(c.style);
  // hidden 6 divides by 2 and 3: DEFAULT shards the hidden layers, replicates the last
  const models::MLPOptions shape{/*in=*/4, /*hidden=*/6, /*out=*/5, /*depth=*/3};
  OracleTwin<models::MLP> twin([&] { return models::MLP(shape); }, w, r);
  models::MLP& net = twin.net();
  DataParallelOptions options;
  options.shard.units = {"layers.0", "layers.1", "layers.2"};
  const bool on_mesh = c.mesh;
  std::optional<comm::DeviceMesh> mesh;
  if (on_mesh) mesh.emplace(pg, std::vector<int64_t>{w}, std::vector<std::string>{"dp"});
  auto model =
      on_mesh ? data_parallel(net, *mesh, style, options) : data_parallel(net, pg, style, options);
  require(model.style() == style && (replicated_runtime(model.wrapped()) != nullptr) ==
                                        (style == DataParallelStyle::kReplicate),
          "the style picks the runtime");
  // The layouts every style answers, over mesh {w} at {r}: DDP names nothing (whole everywhere);
  // FULLY_SHARD shards every parameter on dim 0; DEFAULT the ones whose dim 0 divides by w (the
  // hidden layers' 6 rows at worlds 1-3, the last layer's 5 rows at world 1 only).
  const layout::TensorLayouts& layouts = model.layouts();
  require(layouts.mesh == std::vector<int64_t>{w} && layouts.coordinate == std::vector<int64_t>{r},
          "the layouts' mesh and coordinate");
  if (style == DataParallelStyle::kReplicate) {
    require(layouts.by_name.empty(), "DDP's layouts name no parameter");
  } else {
    for (const auto& item : net->named_parameters()) {
      const auto it = layouts.by_name.find(item.key());
      require(it != layouts.by_name.end(), "no layout for " + item.key());
      const bool divides = it->second.shape.at(0) % w == 0;  // the whole shape
      const bool sharded = style == DataParallelStyle::kFullyShard || divides;
      require(it->second.placements.size() == (sharded ? 1u : 0u),
              item.key() + ": " + std::to_string(it->second.placements.size()) + " placements");
    }
  }
  twin.regression_steps([&](const torch::Tensor& x) { return model(x); }, 3, 3, shape.in,
                        shape.out);
  // Issue 46: after a backward, a forward under grad mode whose backward never runs leaves the
  // sharded styles' gradients set aside and the parameters gathered: reading their layouts (a
  // checkpoint's) and the next forward refuse by name, until reshard() puts them back.
  if (style != DataParallelStyle::kReplicate) {
    torch::manual_seed(5);
    const auto x = torch::randn({3, shape.in});
    torch::mse_loss(model(x), torch::zeros({3, shape.out})).backward();
    (void)model(x);
    const std::string layouts = error_of([&] { (void)model.layouts(); });
    require(layouts ==
                "ddp: layouts: the parameters are gathered by a forward under grad mode whose "
                "backward has not run (an evaluation without torch::NoGradGuard?); call "
                "model.reshard() after such a forward, or run it under torch::NoGradGuard",
            "layouts after a forward without backward: " + layouts);
    const std::string forward = error_of([&] { (void)model(x); });
    require(forward ==
                "ddp: forward: the last forward ran under grad mode and its backward never did "
                "(an evaluation without torch::NoGradGuard?): it set the last backward's "
                "gradients aside, so an optimizer step since then skipped them; call "
                "model.reshard() after such a forward, or run it under torch::NoGradGuard",
            "forward after a forward without backward: " + forward);
    model.reshard();
    require(!model.layouts().by_name.empty(), "layouts after reshard()");
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  }
  // One more step with a forward under grad mode and no backward between the backward and the
  // optimizer step (an evaluation without NoGradGuard), undone by reshard(): the step still
  // equals the oracle's, every style. Without reshard() the sharded styles' step finds no
  // gradients (the forward set the shards' aside) and silently skips them (issue 46).
  {
    torch::manual_seed(7);
    const auto x = torch::randn({3 * w, shape.in});
    const auto y = torch::randn({3 * w, shape.out});
    twin.step(
        [&] {
          torch::mse_loss(model(twin.mine(x)), twin.mine(y)).backward();
          (void)model(twin.mine(x));
          model.reshard();
        },
        [&] { torch::mse_loss(twin.oracle()->forward(x), y).backward(); });
  }
  twin.require_close(whole_parameters(model.wrapped()), 1e-5,
                     std::string("data_parallel ") + shard::style_name(style));
  // zero_grad, every style: each gradient this rank holds is zero.
  model.zero_grad();
  for (const auto& p : net->parameters()) {
    require(!p.grad().defined() || p.grad().abs().sum().item<double>() == 0, "zero_grad");
  }
  if (w == 2) {
    const comm::DeviceMesh flat(pg, {1, 2}, {"a", "b"});
    const std::string wrong = error_of([&] { (void)parallel::data_parallel_group(flat); });
    require(wrong ==
                "ddp: data_parallel over a 2-D mesh needs a mesh dim named 'dp' (or the dims "
                "replicate, shard of hybrid sharding); this mesh's dims are a, b",
            "mesh error: " + wrong);
    // Building `flat` connected new Gloo pairs; a rank that exited while the other still
    // completed its side of them failed it with "Connection closed by peer" (seen in CI runs).
    pg->barrier("mesh built on every rank");
  }
}

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.style << (c.mesh ? " on a mesh" : "") << " world " << c.world;
}

DDP_WORKER_CASE_TEST(DataParallelTest, EveryStyleEqualsSingleProcessTraining, data_parallel_styles,
                     Case);

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.style + (info.param.mesh ? "_mesh" : "") + "_world" +
         std::to_string(info.param.world);
}

INSTANTIATE_TEST_SUITE_P(Styles, DataParallelTest,
                         ::testing::Values(Case{"replicate", false, 1}, Case{"replicate", true, 2},
                                           Case{"fully_shard", false, 3},
                                           Case{"fully_shard", true, 2}, Case{"default", false, 3},
                                           Case{"default", true, 2}),
                         case_name);

// What DistributedDataParallel accepts, every style accepts: a torch::nn::AnyModule, and a module
// whose forward returns a tuple (every tensor in it carries the backward's start, so a loss over
// either works). Both against the single-process oracle, world 1 to 3.
struct TupleMlpImpl : torch::nn::Module {
  explicit TupleMlpImpl(const models::MLPOptions& shape)
      : mlp(register_module("mlp", models::MLP(shape))) {}
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const auto out = mlp->forward(x);
    return {out, out.square().mean()};
  }
  models::MLP mlp;
};
TORCH_MODULE(TupleMlp);

DDP_TEST_WORKER_WITH(data_parallel_any_module, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto style = shard::parse_style(c.style);
  const models::MLPOptions shape{/*in=*/4, /*hidden=*/6, /*out=*/5, /*depth=*/3};
  DataParallelOptions options;
  options.shard.units = {"mlp.layers.0", "mlp.layers.1", "mlp.layers.2"};
  {
    OracleTwin<models::MLP> twin([&] { return models::MLP(shape); }, w, r);
    options.shard.units = {"layers.0", "layers.1", "layers.2"};
    auto model = data_parallel(torch::nn::AnyModule(twin.net()), pg, style, options);
    twin.regression_steps([&](const torch::Tensor& x) { return model(x); }, 3, 3, shape.in,
                          shape.out);
    twin.require_close(whole_parameters(model.wrapped()), 1e-5,
                       std::string("AnyModule, ") + shard::style_name(style));
  }
  OracleTwin<TupleMlp> twin([&] { return TupleMlp(shape); }, w, r);
  options.shard.units = {"mlp.layers.0", "mlp.layers.1", "mlp.layers.2"};
  auto model = data_parallel(twin.net(), pg, style, options);
  const GlobalBatches batches = regression_batches(3, 3 * w, shape.in, shape.out);
  for (int step = 0; step < 3; ++step) {
    const auto& x = batches.x[step];
    const auto& y = batches.y[step];
    twin.step(
        [&] {
          // The second output is a per-rank mean, so it is weighted to make the oracle's the
          // average.
          const auto [out, aux] = model(twin.mine(x));
          (torch::mse_loss(out, twin.mine(y)) + 0.1 * aux).backward();
        },
        [&] {
          const auto out = std::get<0>(twin.oracle()->forward(x));
          torch::Tensor aux = torch::zeros({});
          for (int k = 0; k < w; ++k) aux = aux + out.narrow(0, 3 * k, 3).square().mean();
          (torch::mse_loss(out, y) + 0.1 * aux / w).backward();
        });
  }
  twin.require_close(whole_parameters(model.wrapped()), 1e-5,
                     std::string("tuple output, ") + shard::style_name(style));
}

DDP_WORKER_CASE_TEST(DataParallelAnyModule, TakesAnyModuleAndTupleOutputsInEveryStyle,
                     data_parallel_any_module, Case);

INSTANTIATE_TEST_SUITE_P(Styles, DataParallelAnyModule,
                         ::testing::Values(Case{"replicate", false, 2},
                                           Case{"fully_shard", false, 1},
                                           Case{"fully_shard", false, 3},
                                           Case{"default", false, 2}),
                         case_name);

}  // namespace
}  // namespace ddp::testing
