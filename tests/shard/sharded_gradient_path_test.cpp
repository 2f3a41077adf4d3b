// FULLY_SHARD and DEFAULT through the one gradient runtime (gradients/gradient_runtime.hpp: one
// bucket per unit, reduce-scattered; DEFAULT's replicated parameters in all-reduced buckets of the
// same runtime) at world 1, 2 and 3 on Gloo: training equals the single-process oracle (rel. err
// < 1e-5); the runtime stats and the trace's comm lane show one reduce-scatter per unit per step
// and, under DEFAULT, the replicated buckets' all-reduces beside them; the bf16 and fp16
// compression hooks reduce-scatter within their rounding of the oracle; the optimizer in backward
// steps on the shards and equals the oracle; PowerSGD is refused by exact text.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "ddp/hooks/default_hooks.hpp"
#include "ddp/hooks/powersgd_hook.hpp"
#include "ddp/models/mlp.hpp"
#include "ddp/obs/chrome_trace.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/error_text.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// 5 output rows: uneven at world 2 and 3, so DEFAULT replicates the last layer's parameters there.
models::MLPOptions mlp_shape() {
  return models::MLPOptions{/*in=*/6, /*hidden=*/12, /*out=*/5, /*depth=*/4};
}

// A worker's run: the style, on Gloo on the CPU (CI) or on NCCL on CUDA (scripts/gpu-check.sh:
// the hooks on torch 2.x).
struct Case {
  std::string style;
  std::string backend = "gloo";
  std::string device = "cpu";
  DDP_CASE_FIELDS(style, backend, device)
};

comm::ProcessGroupPtr runtime_group(const Case& c) {
  return worker_process_group(std::chrono::seconds(60), c.backend);
}
torch::Device runtime_device(const Case& c) { return torch::Device(c.device); }

models::MLP make_mlp(const Case& c) {
  models::MLP net(mlp_shape());
  net->to(runtime_device(c));
  return net;
}

shard::ShardOptions unit_options(const std::string& style) {
  shard::ShardOptions options;
  options.style = shard::parse_style(style);
  for (int64_t i = 0; i < mlp_shape().depth; ++i) {
    options.units.push_back("layers." + std::to_string(i));
  }
  return options;
}

struct Run {
  int64_t steps = 3;
  double lr = 0.1;
  std::string hook;  // "", "bf16", "fp16" or "powersgd"
  bool optimizer_in_backward = false;
};

// Trains the sharded MLP and the oracle on the same global batches (SGD with momentum; the
// optimizer in backward: plain SGD per parameter); returns the sharded wrapper's whole parameters
// and checks the stats on the way.
NamedTensors train(comm::ProcessGroupPtr pg, const Case& c, Run run, models::MLP oracle) {
  const int w = pg->world_size(), r = pg->rank();
  torch::manual_seed(r);  // the wrapper broadcasts rank 0's values
  models::MLP net = make_mlp(c);
  shard::FullyShardedDataParallel<models::MLP> model(net, pg, unit_options(c.style));
  if (run.hook == "bf16") model.register_comm_hook(hooks::bf16_compress_hook(pg));
  if (run.hook == "fp16") model.register_comm_hook(hooks::fp16_compress_hook(pg));
  if (run.hook == "powersgd") model.register_comm_hook(hooks::powersgd_hook(pg));
  const auto sgd = [&](std::vector<torch::Tensor> params) {
    return make_test_optimizer(run.optimizer_in_backward ? "plain-sgd" : "sgd", std::move(params),
                               run.lr);
  };
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (run.optimizer_in_backward) {
    model.set_optimizer_in_backward([&](const torch::Tensor& p) { return sgd({p}); });
  } else {
    opt = sgd(net->parameters());
  }
  auto oracle_opt = sgd(oracle->parameters());
  torch::manual_seed(1);
  const int64_t per_rank = 3;
  for (int64_t s = 0; s < run.steps; ++s) {
    const auto x = torch::randn({w * per_rank, mlp_shape().in}).to(runtime_device(c));
    const auto y = torch::randn({w * per_rank, mlp_shape().out}).to(runtime_device(c));
    torch::mse_loss(model(x.narrow(0, r * per_rank, per_rank)), y.narrow(0, r * per_rank, per_rank))
        .backward();
    if (opt) {
      opt->step();
      opt->zero_grad();
    } else {
      model.zero_grad();  // the steps ran at the end of backward
    }
    torch::mse_loss(oracle->forward(x), y).backward();
    oracle_opt->step();
    oracle_opt->zero_grad();
  }
  return whole_parameters(model);
}

DDP_TEST_WORKER_WITH(unit_runtime_training_and_stats, Case, c) {
  auto pg = runtime_group(c);
  const std::string& style = c.style;
  const auto options = unit_options(style);
  torch::manual_seed(0);
  models::MLP oracle = make_mlp(c);
  const Run run;
  // The same training, watched: stats and the trace's comm lane.
  const int w = pg->world_size(), r = pg->rank();
  torch::manual_seed(r);
  models::MLP net = make_mlp(c);
  shard::FullyShardedDataParallel<models::MLP> model(net, pg, options);
  auto opt = make_test_optimizer("sgd", net->parameters(), run.lr);
  auto oracle_opt = make_test_optimizer("sgd", oracle->parameters(), run.lr);
  torch::manual_seed(1);
  obs::ChromeTrace trace(r);
  for (int64_t s = 0; s < run.steps; ++s) {
    const auto x = torch::randn({w * 3, mlp_shape().in}).to(runtime_device(c));
    const auto y = torch::randn({w * 3, mlp_shape().out}).to(runtime_device(c));
    torch::mse_loss(model(x.narrow(0, r * 3, 3)), y.narrow(0, r * 3, 3)).backward();
    opt->step();
    opt->zero_grad();
    torch::mse_loss(oracle->forward(x), y).backward();
    oracle_opt->step();
    oracle_opt->zero_grad();
    trace.add_buckets(model.last_timeline(), model.bucket_plan(), s);
  }
  require_close_by_name(whole_parameters(model), *oracle, 1e-5, style + " through the runtime");

  // One bucket per unit with sharded parameters, (world, S) elements of fp32 each, launched in
  // the reverse of the forward's order: the last layer's unit first. Then DEFAULT's replicated
  // parameters (the 5-row last layer at world 2 and 3), all-reduced: 5 x 12 + 5 floats, one
  // bucket under the default caps.
  const auto& plan = model.bucket_plan();
  size_t units_with_shards = 0;
  for (const auto& unit : model.plan().units) {
    bool any = false;
    for (size_t i : unit.params) any |= model.plan().params[i].sharded();
    units_with_shards += any ? 1 : 0;
  }
  const bool replicated = style == "default" && w > 1;
  require(plan.buckets.size() == units_with_shards + (replicated ? 1 : 0),
          "buckets " + std::to_string(plan.buckets.size()) + " for " +
              std::to_string(units_with_shards) + " units with shards");
  const obs::LoggingData data = model.logging_data();
  require(data.iterations == run.steps, "iterations " + std::to_string(data.iterations));
  require(data.comm_hook == "reduce_scatter", "comm hook " + data.comm_hook);
  require(data.bucket_sizes.size() == plan.buckets.size() &&
              data.bucket_reductions.size() == plan.buckets.size(),
          "bucket sizes and reductions");
  size_t shard_bytes = 0;
  for (size_t b = 0; b < units_with_shards; ++b) shard_bytes += data.bucket_sizes[b];
  if (replicated) {
    require(data.bucket_reductions.back() == buckets::Reduction::kAllReduce &&
                data.bucket_sizes.back() == (5 * 12 + 5) * 4,
            "DEFAULT's replicated bucket: " + std::to_string(data.bucket_sizes.back()) + " bytes");
  }
  const std::string listed =
      (replicated ? "  buckets           1 all-reduced (260 bytes), " : "  buckets           ") +
      std::to_string(units_with_shards) + " reduce-scattered (" + std::to_string(shard_bytes) +
      " bytes)\n";
  require(obs::format_summary(data).find(listed) != std::string::npos,
          "the stats list every bucket's reduction, expected '" + listed + "' in:\n" +
              obs::format_summary(data));
  for (size_t b = 0; b < units_with_shards; ++b) {
    require(data.bucket_reductions[b] == buckets::Reduction::kReduceScatter,
            "bucket " + std::to_string(b) + " is reduce-scattered");
    int64_t numel = 0;
    for (size_t p : plan.buckets[b].params) {
      const std::string& name = data.param_names[p];
      for (size_t i = 0; i < model.plan().shapes.size(); ++i) {
        if (model.plan().shapes[i].name == name) numel += model.plan().params[i].local_numel();
      }
    }
    require(data.bucket_sizes[b] == static_cast<size_t>(w * numel * 4),
            "bucket " + std::to_string(b) + " holds its unit's (world, S) fp32 layout");
  }
  require(
      data.param_names[plan.buckets[0].params[0]].rfind(
          "layers." + std::to_string(mlp_shape().depth - 1), 0) == 0 ||
          style == "default",
      "the last layer's unit is launched first: " + data.param_names[plan.buckets[0].params[0]]);
  require(static_cast<int64_t>(data.samples.size()) == run.steps, "a sample per step");
  for (const auto& sample : data.samples) {
    require(sample.backward_comm_ns > 0,
            "reduce-scatter time in iteration " + std::to_string(sample.iteration));
  }
  int64_t comm_spans = 0;
  for (const auto& span : trace.spans()) {
    if (span.cat == "comm" && span.lane == 1 && span.bytes > 0) ++comm_spans;
  }
  require(comm_spans == run.steps * static_cast<int64_t>(plan.buckets.size()),
          "the trace's comm lane: " + std::to_string(comm_spans) + " spans (every bucket's)");
}

// bf16 rounds each rank's contribution to 8 bits of mantissa; fp16 to 11. Both stay within their
// rounding of the fp32 oracle after a few SGD steps, and differ from it (the hook ran).
DDP_TEST_WORKER_WITH(unit_runtime_compression_hooks, Case, c) {
  auto pg = runtime_group(c);
  const std::string& style = c.style;
  for (const std::string hook : {"bf16", "fp16"}) {
    torch::manual_seed(0);
    models::MLP oracle = make_mlp(c);
    Run run;
    run.hook = hook;
    const auto ours = train(pg, c, run, oracle);
    const double tolerance = hook == "bf16" ? 2e-2 : 3e-3;
    require_close_by_name(ours, *oracle, tolerance, hook + " hook under " + style);
    bool differs = false;
    const auto named = oracle->named_parameters();
    for (const auto& [name, value] : ours) differs |= !torch::equal(value, named[name].cpu());
    require(differs, hook + " hook: the reduce-scatter was compressed");
  }
  torch::manual_seed(0);
  models::MLP oracle = make_mlp(c);
  Run refused;
  refused.hook = "powersgd";
  refused.steps = 1;
  const std::string wrong = error_of([&] { train(pg, c, refused, oracle); });
  require(wrong.find("ddp: comm hook 'powersgd' cannot reduce-scatter a FULLY_SHARD unit (bucket "
                     "0): its low-rank factors are all-reduced whole; use allreduce, fp16_compress "
                     "or bf16_compress under fully_shard and default") != std::string::npos,
          "powersgd: " + wrong);
}

DDP_TEST_WORKER_WITH(unit_runtime_optimizer_in_backward, Case, c) {
  auto pg = runtime_group(c);
  torch::manual_seed(0);
  models::MLP oracle = make_mlp(c);
  Run run;
  run.optimizer_in_backward = true;
  const auto ours = train(pg, c, run, oracle);
  require_close_by_name(ours, *oracle, 1e-5, "optimizer in backward under " + c.style);
}

class ShardedGradientPathTest : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

std::string runtime_name(const ::testing::TestParamInfo<std::tuple<int, const char*>>& info) {
  return std::string(std::get<1>(info.param)) + "_world" + std::to_string(std::get<0>(info.param));
}

TEST_P(ShardedGradientPathTest, TrainsLikeTheOracleAndShowsEachUnitsReduceScatter) {
  const auto [world, style] = GetParam();
  EXPECT_WORKERS_PASS(run_workers(unit_runtime_training_and_stats, world, Case{style}));
}

TEST_P(ShardedGradientPathTest, CompressionHooksReduceScatterWithinTheirRounding) {
  const auto [world, style] = GetParam();
  EXPECT_WORKERS_PASS(run_workers(unit_runtime_compression_hooks, world, Case{style}));
}

TEST_P(ShardedGradientPathTest, OptimizerInBackwardStepsOnTheShards) {
  const auto [world, style] = GetParam();
  EXPECT_WORKERS_PASS(run_workers(unit_runtime_optimizer_in_backward, world, Case{style}));
}

// The same workers on one GPU with NCCL (torch 2.x: the tensor hooks, the stream order of the
// reduce-scatters); skipped without CUDA, as on CI.
TEST(ShardedGradientPathGpu, EveryWorkerOnNcclAtWorldOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Worker<Case>* worker :
       {&unit_runtime_training_and_stats, &unit_runtime_compression_hooks,
        &unit_runtime_optimizer_in_backward}) {
    for (const char* style : {"fully_shard", "default"}) {
      Case c;
      c.style = style;
      c.backend = "nccl";
      c.device = "cuda";
      const auto result =
          run_workers(*worker, 1, c, {{"NCCL_NVLS_ENABLE", "0"}}, std::chrono::seconds(240));
      EXPECT_TRUE(result.ok()) << worker->name() << " " << style << ": " << result.describe();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStyles, ShardedGradientPathTest,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values("fully_shard", "default")),
                         runtime_name);

}  // namespace
}  // namespace ddp::testing
