// The per-unit schedule (run_unit, shard/unit_scope.hpp) at world 1, 2 and 3 on Gloo: the zoo GPT
// with tied wte / lm_head and a unit per block (SGD + momentum), the zoo MLP with a unit per layer
// (Adam, AdamW, SGD). After K steps the parameters equal single-process training on the global
// batch (rel. err < 1e-5), with reshard_after_forward and prefetch on and off; the gathered
// memory stays within the root unit plus three units; an evaluation forward
// equals the oracle's and leaves the shards in place.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/models/gpt.hpp"
#include "ddp/models/mlp.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "support/error_text.hpp"
#include "support/global_batches.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/regression_steps.hpp"
#include "support/tiny_gpt.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// Small and uneven: vocab 37 rows do not divide by 2 or 3; 6 blocks so that a block is a small
// part of the model and the memory bound below means something.
models::GPTConfig tiny() { return tiny_gpt(/*n_layers=*/6); }

std::vector<std::string> block_units(const models::GPTConfig& c) {
  std::vector<std::string> units;
  for (int64_t i = 0; i < c.n_layers; ++i) units.push_back("h." + std::to_string(i));
  return units;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        std::vector<torch::Tensor> params) {
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  }
  if (kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// One run: `model` (sharded) and `oracle` (the same initial values) train on the same global
// batches; returns after comparing the whole parameters. `loss(module output, targets)`.
template <typename Holder, typename Loss>
void train_and_compare(comm::ProcessGroupPtr pg, Holder net, Holder oracle,
                       shard::ShardOptions options, const std::vector<torch::Tensor>& xs,
                       const std::vector<torch::Tensor>& ys, Loss loss, const std::string& what) {
  const int w = pg->world_size(), r = pg->rank();
  const int64_t per_rank = xs[0].size(0) / w, steps = static_cast<int64_t>(xs.size()) - 1;
  const std::string opt_kind = worker_env("DDP_TEST_OPT");
  shard::FullyShardedDataParallel<Holder> model(net, pg, options);
  auto opt = make_optimizer(opt_kind, distinct(net->parameters()));
  auto oracle_opt = make_optimizer(opt_kind, distinct(oracle->parameters()));
  const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, r * per_rank, per_rank); };
  for (int64_t s = 0; s < steps; ++s) {
    if (s == 1) model.reset_peak_memory();  // step 0 gathers everything: it learns the order
    loss(model(mine(xs[s])), mine(ys[s])).backward();
    opt->step();
    opt->zero_grad();
    loss(oracle->forward(xs[s]), ys[s]).backward();
    oracle_opt->step();
    oracle_opt->zero_grad();
  }
  require(model.unit_order().size() == options.units.size(), "every unit ran through run_unit");
  // An evaluation forward gathers and puts the shards back; the sharded state is unchanged.
  {
    torch::NoGradGuard no_grad;
    const auto out = model(mine(xs[steps]));
    const auto expected = mine(oracle->forward(xs[steps]));
    require(torch::allclose(out, expected, 1e-4, 1e-5), "evaluation forward");
  }
  int64_t held = 0;
  for (const auto& p : distinct(net->parameters())) {
    held += p.numel() * static_cast<int64_t>(sizeof(float));
  }
  require(held == model.local_param_bytes(), "between steps the module holds its shards");

  // Memory: the root unit stays gathered; of the other units, the one computing, the gather
  // buffer (the prefetched one in flight, or kept for the next gather: shard/gather_pool.hpp) and
  // the one whose reduce-scatter is in flight (docs/design/sharding.md, Memory).
  const auto& plan = model.plan();
  int64_t root = 0, largest = 0, total = 0;
  for (const auto& unit : plan.units) {
    int64_t bytes = 0;
    for (size_t i : unit.params) bytes += plan.params[i].local_numel() * w * 4;
    if (unit.name.empty()) {
      root = bytes;
    } else {
      largest = std::max(largest, bytes);
    }
    total += bytes;
  }
  const int64_t bound = root + 3 * largest;
  const int64_t peak = model.memory().peak_gathered_bytes;
  const std::string numbers = "peak gathered " + std::to_string(peak) + " bytes, bound " +
                              std::to_string(bound) + " (root " + std::to_string(root) +
                              ", largest unit " + std::to_string(largest) + ", model " +
                              std::to_string(total) + ")";
  if (options.reshard_after_forward) {
    require(peak > 0 && peak <= bound && bound < total, numbers);
  } else {
    require(peak >= total, "without resharding every unit stays gathered: " + numbers);
  }

  require_close_by_name(whole_parameters(model), *oracle, 1e-5, what + ", " + opt_kind);
}

shard::ShardOptions schedule_options() {
  shard::ShardOptions options;
  options.reshard_after_forward = worker_env("DDP_TEST_RESHARD") == "1";
  options.prefetch = worker_env("DDP_TEST_PREFETCH") == "1";
  return options;
}

DDP_TEST_WORKER(unit_schedule_gpt) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto config = tiny();
  auto options = schedule_options();
  options.units = block_units(config);
  torch::manual_seed(r);  // the wrapper must broadcast rank 0's values
  models::GPT gpt(config);
  gpt->checkpoint_units = worker_env("DDP_TEST_CHECKPOINT", "0") == "1";
  torch::manual_seed(0);
  models::GPT oracle(config);  // never checkpointed: the recompute must not change a thing
  torch::manual_seed(1);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < 4; ++s) {
    xs.push_back(torch::randint(config.vocab_size, {w * 2, config.seq_len}));
    ys.push_back(torch::randint(config.vocab_size, {w * 2, config.seq_len}));
  }
  {
    shard::FullyShardedDataParallel<models::GPT> probe(models::GPT(config), pg, options);
    const auto& units = probe.plan().units;
    require(units.back().name.empty() &&
                probe.plan().shapes[units.back().params[0]].name == "wte.weight",
            "the tied wte / lm_head weight is in the root unit");
  }
  const auto loss = [](const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                targets.reshape({-1}));
  };
  train_and_compare(pg, gpt, oracle, options, xs, ys, loss,
                    "per-block FULLY_SHARD of the tied GPT");
}

// Adam divides by the root of its second moment, so a gradient that is zero in exact arithmetic
// (the GPT's key bias: softmax ignores a constant added to every key) is rounding noise that Adam
// amplifies to a full step, differently in any two summation orders. The MLP has none.
DDP_TEST_WORKER(unit_schedule_mlp) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  models::MLPOptions shape;
  shape.in = 6;
  shape.hidden = 10;
  shape.out = 5;  // 5 rows: uneven at world 2 and 3
  shape.depth = 5;
  auto options = schedule_options();
  for (int64_t i = 0; i < shape.depth; ++i) options.units.push_back("layers." + std::to_string(i));
  torch::manual_seed(r);
  models::MLP mlp(shape);
  torch::manual_seed(0);
  models::MLP oracle(shape);
  const GlobalBatches batches = regression_batches(4, w * 3, shape.in, shape.out);
  const std::vector<torch::Tensor>& xs = batches.x;
  const std::vector<torch::Tensor>& ys = batches.y;
  const auto loss = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  train_and_compare(pg, mlp, oracle, options, xs, ys, loss, "per-layer FULLY_SHARD of the MLP");
}

// reduce_dtype: fp16 reduce-scatters end within fp16's rounding of the fp32 oracle; bf16, which
// Gloo cannot reduce, is refused at construction naming the dtype and the backend.
DDP_TEST_WORKER(unit_schedule_reduce_dtype) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  models::MLPOptions shape;
  shape.in = 6;
  shape.hidden = 10;
  shape.out = 5;
  shape.depth = 3;
  shard::ShardOptions options;
  options.units = {"layers.0", "layers.1", "layers.2"};
  options.reduce_dtype = torch::kBFloat16;
  const std::string wrong = error_of([&] {
    shard::FullyShardedDataParallel<models::MLP> refused(models::MLP(shape), pg, options);
  });
  require(wrong.rfind("ddp: reduce_dtype BFloat16: the gloo backend cannot reduce it (", 0) == 0,
          "bf16 on Gloo: " + wrong);
  options.reduce_dtype = torch::kHalf;
  torch::manual_seed(0);
  models::MLP net(shape);
  torch::manual_seed(0);
  models::MLP oracle(shape);
  shard::FullyShardedDataParallel<models::MLP> model(net, pg, options);
  regression_steps([&](const torch::Tensor& x) { return model(x); }, net->parameters(), oracle, w,
                   r, shape.in, shape.out, 3);
  // fp16 keeps 11 bits: a reduced gradient is within about 5e-4 of the exact one, relative.
  require_close_by_name(whole_parameters(model), *oracle, 2e-3, "reduce_dtype fp16");
}

class ReduceDtypeTest : public ::testing::TestWithParam<int> {};

TEST_P(ReduceDtypeTest, HalfReducesWithinItsRoundingAndGlooRefusesBFloat16) {
  const auto result = run_workers("unit_schedule_reduce_dtype", GetParam());
  EXPECT_TRUE(result.ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReduceDtypeTest, ::testing::Values(2, 3), world_name);

struct Case {
  std::string model, opt;
  bool reshard, prefetch;
  int world;
  bool checkpoint = false;  // activation checkpointing of every unit (GPT only)
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.model << " " << c.opt << " reshard " << c.reshard << " prefetch " << c.prefetch
       << " world " << c.world;
}

class UnitScheduleTest : public ::testing::TestWithParam<Case> {};

TEST_P(UnitScheduleTest, EqualsSingleProcessTrainingOnTheGlobalBatch) {
  const Case& c = GetParam();
  const auto result = run_workers("unit_schedule_" + c.model, c.world,
                                  {{"DDP_TEST_OPT", c.opt},
                                   {"DDP_TEST_RESHARD", c.reshard ? "1" : "0"},
                                   {"DDP_TEST_PREFETCH", c.prefetch ? "1" : "0"},
                                   {"DDP_TEST_CHECKPOINT", c.checkpoint ? "1" : "0"}});
  EXPECT_TRUE(result.ok()) << result.describe();
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.model + "_" + c.opt + (c.reshard ? "_reshard" : "_keep") +
         (c.prefetch ? "_prefetch" : "_noprefetch") + (c.checkpoint ? "_checkpoint" : "") +
         "_world" + std::to_string(c.world);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, UnitScheduleTest,
    ::testing::Values(Case{"gpt", "sgd", true, true, 1}, Case{"gpt", "sgd", true, true, 2},
                      Case{"gpt", "sgd", true, true, 3}, Case{"gpt", "sgd", true, false, 3},
                      Case{"gpt", "sgd", false, true, 2}, Case{"mlp", "adam", true, true, 3},
                      Case{"mlp", "adam", false, false, 2}, Case{"mlp", "adamw", true, false, 2},
                      Case{"mlp", "sgd", true, true, 1}, Case{"gpt", "sgd", true, true, 3, true},
                      Case{"gpt", "sgd", false, false, 2, true}),
    case_name);

}  // namespace
}  // namespace ddp::testing
