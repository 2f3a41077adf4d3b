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
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
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

// A schedule: the model, the optimizer, the ShardOptions switches and the world.
struct Case {
  std::string model;  // "gpt" or "mlp": the worker that runs
  std::string opt;    // "adam", "adamw" or else SGD with momentum
  bool reshard = false, prefetch = false;
  int world = 1;
  bool checkpoint = false;  // activation checkpointing of every unit (GPT only)
  DDP_CASE_FIELDS(opt, reshard, prefetch, checkpoint)
};

// One run: the twin's copy (sharded) and its oracle train on the same global batches (all but the
// last, which an evaluation forward reads); returns after comparing the whole parameters.
// `loss(module output, targets)`.
template <typename Holder, typename Loss>
void train_and_compare(comm::ProcessGroupPtr pg, OracleTwin<Holder>& twin,
                       shard::ShardOptions options, const std::vector<torch::Tensor>& xs,
                       const std::vector<torch::Tensor>& ys, Loss loss, const std::string& what) {
  const int64_t steps = static_cast<int64_t>(xs.size()) - 1, w = pg->world_size();
  Holder& net = twin.net();
  Holder& oracle = twin.oracle();
  shard::FullyShardedDataParallel<Holder> model(net, pg, options);
  const auto mine = [&](const torch::Tensor& t) { return twin.mine(t); };
  for (int64_t s = 0; s < steps; ++s) {
    if (s == 1) model.reset_peak_memory();  // step 0 gathers everything: it learns the order
    twin.step([&] { loss(model(mine(xs[s])), mine(ys[s])).backward(); },
              [&] { loss(oracle->forward(xs[s]), ys[s]).backward(); });
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

  twin.require_close(whole_parameters(model), 1e-5, what);
}

shard::ShardOptions schedule_options(const Case& c) {
  shard::ShardOptions options;
  options.reshard_after_forward = c.reshard;
  options.prefetch = c.prefetch;
  return options;
}

DDP_TEST_WORKER_WITH(unit_schedule_gpt, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const auto config = tiny();
  auto options = schedule_options(c);
  options.units = block_units(config);
  TwinOptions twin_options;
  twin_options.optimizer = c.opt;
  OracleTwin<models::GPT> twin([&] { return models::GPT(config); }, w, r, twin_options);
  // The oracle is never checkpointed: the recompute must not change a thing.
  twin.net()->checkpoint_units = c.checkpoint;
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
  train_and_compare(pg, twin, options, xs, ys, loss,
                    "per-block FULLY_SHARD of the tied GPT, " + c.opt);
}

// Adam divides by the root of its second moment, so a gradient that is zero in exact arithmetic
// (the GPT's key bias: softmax ignores a constant added to every key) is rounding noise that Adam
// amplifies to a full step, differently in any two summation orders. The MLP has none.
DDP_TEST_WORKER_WITH(unit_schedule_mlp, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  // out 5 rows: uneven at world 2 and 3
  const models::MLPOptions shape{/*in=*/6, /*hidden=*/10, /*out=*/5, /*depth=*/5};
  auto options = schedule_options(c);
  for (int64_t i = 0; i < shape.depth; ++i) options.units.push_back("layers." + std::to_string(i));
  TwinOptions twin_options;
  twin_options.optimizer = c.opt;
  OracleTwin<models::MLP> twin([&] { return models::MLP(shape); }, w, r, twin_options);
  const GlobalBatches batches = regression_batches(4, w * 3, shape.in, shape.out);
  const std::vector<torch::Tensor>& xs = batches.x;
  const std::vector<torch::Tensor>& ys = batches.y;
  const auto loss = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  train_and_compare(pg, twin, options, xs, ys, loss, "per-layer FULLY_SHARD of the MLP, " + c.opt);
}

// reduce_dtype: fp16 reduce-scatters end within fp16's rounding of the fp32 oracle; bf16, which
// Gloo cannot reduce, is refused at construction naming the dtype and the backend.
DDP_TEST_WORKER(unit_schedule_reduce_dtype) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  const models::MLPOptions shape{/*in=*/6, /*hidden=*/10, /*out=*/5, /*depth=*/3};
  shard::ShardOptions options;
  options.units = {"layers.0", "layers.1", "layers.2"};
  options.reduce_dtype = torch::kBFloat16;
  const std::string wrong = error_of([&] {
    shard::FullyShardedDataParallel<models::MLP> refused(models::MLP(shape), pg, options);
  });
  require(wrong.rfind("ddp: reduce_dtype BFloat16: the gloo backend cannot reduce it (", 0) == 0,
          "bf16 on Gloo: " + wrong);
  options.reduce_dtype = torch::kHalf;
  OracleTwin<models::MLP> twin([&] { return models::MLP(shape); }, w, r);
  shard::FullyShardedDataParallel<models::MLP> model(twin.net(), pg, options);
  twin.regression_steps([&](const torch::Tensor& x) { return model(x); }, 3, 3, shape.in,
                        shape.out);
  // fp16 keeps 11 bits: a reduced gradient is within about 5e-4 of the exact one, relative.
  twin.require_close(whole_parameters(model), 2e-3, "reduce_dtype fp16");
}

DDP_WORKER_TEST_PER_WORLD(ReduceDtypeTest, HalfReducesWithinItsRoundingAndGlooRefusesBFloat16,
                          unit_schedule_reduce_dtype, 2, 3);

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.model << " " << c.opt << " reshard " << c.reshard << " prefetch " << c.prefetch
       << " world " << c.world;
}

class UnitScheduleTest : public ::testing::TestWithParam<Case> {};

TEST_P(UnitScheduleTest, EqualsSingleProcessTrainingOnTheGlobalBatch) {
  const Case& c = GetParam();
  EXPECT_WORKERS_PASS(
      run_workers(c.model == "gpt" ? unit_schedule_gpt : unit_schedule_mlp, c.world, c));
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
