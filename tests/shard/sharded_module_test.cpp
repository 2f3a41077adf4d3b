// ShardedModule (FULLY_SHARD and DEFAULT over a whole module) at world 1, 2 and 3 on Gloo: after
// K steps of SGD + momentum on the shards, the gathered parameters equal single-process training
// on the global batch (rel. err < 1e-5), with one unit and with a unit per layer; DEFAULT mixes
// sharded and replicated parameters in one backward.

#include "ddp/shard/sharded_module.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/comm/recorder/flight_ring.hpp"

#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// dim 0: 6, 6, 3, 3, 2, 2. World 3 under DEFAULT shards the first four and replicates the last
// two; world 2 replicates the middle two.
torch::nn::Sequential make_net() {
  return torch::nn::Sequential(torch::nn::Linear(5, 6), torch::nn::ReLU(), torch::nn::Linear(6, 3),
                               torch::nn::Linear(3, 2));
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = text.find(',', start);
    const size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// A training run: the style and the units (comma-separated module paths; empty: one unit).
struct Case {
  std::string style, units;
  int world = 1;
  DDP_CASE_FIELDS(style, units)
};

DDP_TEST_WORKER_WITH(sharded_module_training, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  shard::ShardOptions options;
  options.style = shard::parse_style(c.style);
  options.units = split(c.units);
  // Rank r's model starts from another seed: the construction must broadcast rank 0's.
  OracleTwin<torch::nn::Sequential> twin(make_net, w, r);
  shard::FullyShardedDataParallel<torch::nn::Sequential> model(twin.net(), pg, options);
  if (options.style == shard::DataParallelStyle::kDefault && w == 3) {
    const std::string table = model.unit_table();
    require(table.find("| 2.weight    | [3, 6] | shard     |") != std::string::npos &&
                table.find("| 3.weight    | [2, 3] | replicate |") != std::string::npos,
            "unit table:\n" + table);
  }
  twin.regression_steps([&](const torch::Tensor& x) { return model(x); }, /*steps=*/5,
                        /*rows_per_rank=*/4, 5, 2);
  // Between steps the module holds exactly the plan's bytes: shards (padded) plus replicas.
  int64_t held = 0;
  for (const auto& p : twin.net()->parameters()) {
    held += p.numel() * static_cast<int64_t>(sizeof(float));
  }
  require(held == model.local_param_bytes(), "parameter bytes held: " + std::to_string(held) +
                                                 ", planned " +
                                                 std::to_string(model.local_param_bytes()));
  twin.require_close(whole_parameters(model), 1e-5, "sharded training");
  // One number per unit (house 5): the recorder tags a unit's reduce-scatters with the unit index
  // its gathers carry (the plan's), not with the bucket's position in the backward.
  std::set<int64_t> gathered, reduced;
  for (const comm::FlightEntry& e : pg->flight_snapshot().entries) {
    if (e.purpose.what == comm::Purpose::kUnitGather) gathered.insert(e.purpose.index);
    if (e.purpose.what == comm::Purpose::kUnitReduce) reduced.insert(e.purpose.index);
  }
  auto list = [](const std::set<int64_t>& s) {
    std::string out;
    for (int64_t i : s) out += " " + std::to_string(i);
    return out;
  };
  require(w == 1 || (!reduced.empty() && reduced == gathered),
          "units gathered:" + list(gathered) + "; units reduced:" + list(reduced));
}

// no_sync: 3 micro-batches accumulate locally, the 4th reduces the sum; the oracle accumulates the
// 4 micro-batches of the global batch and steps once.
DDP_TEST_WORKER_WITH(sharded_module_no_sync, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  shard::ShardOptions options;
  options.style = shard::parse_style(c.style);
  const int64_t per_rank = 2, micro = 4, steps = 2;
  OracleTwin<torch::nn::Sequential> twin(make_net, w, r);
  shard::FullyShardedDataParallel<torch::nn::Sequential> model(twin.net(), pg, options);
  torch::manual_seed(2);
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> xs, ys;
    for (int64_t m = 0; m < micro; ++m) {
      xs.push_back(torch::randn({w * per_rank, 5}));
      ys.push_back(torch::randn({w * per_rank, 2}));
    }
    const auto backward = [&](int64_t m) {
      torch::mse_loss(model(twin.mine(xs[m])), twin.mine(ys[m])).backward();
    };
    twin.step(
        [&] {
          for (int64_t m = 0; m + 1 < micro; ++m) {
            auto guard = model.no_sync();
            backward(m);
            require(twin.net()->parameters()[0].size(0) == 6,
                    "inside no_sync the parameters stay gathered");
          }
          backward(micro - 1);
        },
        [&] {
          for (int64_t m = 0; m < micro; ++m) {
            torch::mse_loss(twin.oracle()->forward(xs[m]), ys[m]).backward();
          }
        });
  }
  twin.require_close(whole_parameters(model), 1e-5, "no_sync then a synchronized step");
}

class ShardedNoSyncTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedNoSyncTest, FullyShardAccumulatesThenReducesTheSum) {
  EXPECT_WORKERS_PASS(run_workers(sharded_module_no_sync, GetParam(), Case{"fully_shard", "", 1}));
}

TEST_P(ShardedNoSyncTest, DefaultAccumulatesThenReducesTheSum) {
  EXPECT_WORKERS_PASS(run_workers(sharded_module_no_sync, GetParam(), Case{"default", "", 1}));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedNoSyncTest, ::testing::Values(1, 2, 3), world_name);

// Printed by gtest for a failing case instead of the struct's bytes.
void PrintTo(const Case& c, std::ostream* out) {
  *out << c.style << " units '" << c.units << "' world " << c.world;
}

DDP_WORKER_CASE_TEST(ShardedModuleTest, EqualsSingleProcessTrainingOnTheGlobalBatch,
                     sharded_module_training, Case);

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.style + (c.units.empty() ? "_one_unit" : "_unit_per_layer") + "_world" +
         std::to_string(c.world);
}

INSTANTIATE_TEST_SUITE_P(Styles, ShardedModuleTest,
                         ::testing::Values(Case{"fully_shard", "", 1}, Case{"fully_shard", "", 2},
                                           Case{"fully_shard", "", 3},
                                           Case{"fully_shard", "0,2,3", 3},
                                           Case{"default", "0,2,3", 2}, Case{"default", "", 3}),
                         case_name);

}  // namespace
}  // namespace ddp::testing
