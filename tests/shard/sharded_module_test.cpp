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

#include "support/global_batches.hpp"
#include "support/oracle.hpp"
#include "support/param_names.hpp"
#include "support/regression_steps.hpp"
#include "support/whole_parameters.hpp"
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

DDP_TEST_WORKER(sharded_module_training) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  shard::ShardOptions options;
  options.style = shard::parse_style(worker_env("DDP_TEST_STYLE"));
  options.units = split(worker_env("DDP_TEST_UNITS", ""));
  const int64_t per_rank = 4, steps = 5;
  // Rank r's model starts from another seed: the construction must broadcast rank 0's.
  torch::manual_seed(r);
  auto net = make_net();
  torch::manual_seed(0);
  auto oracle = make_net();
  const GlobalBatches batches = regression_batches(steps, w * per_rank, 5, 2);
  const std::vector<torch::Tensor>& xs = batches.x;
  const std::vector<torch::Tensor>& ys = batches.y;
  shard::FullyShardedDataParallel<torch::nn::Sequential> model(net, pg, options);
  if (options.style == shard::DataParallelStyle::kDefault && w == 3) {
    const std::string table = model.unit_table();
    require(table.find("| 2.weight    | [3, 6] | shard     |") != std::string::npos &&
                table.find("| 3.weight    | [2, 3] | replicate |") != std::string::npos,
            "unit table:\n" + table);
  }
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t s = 0; s < steps; ++s) {
    const auto x = xs[s].narrow(0, r * per_rank, per_rank);
    const auto y = ys[s].narrow(0, r * per_rank, per_rank);
    torch::mse_loss(model(x), y).backward();
    opt.step();
    opt.zero_grad();
    torch::mse_loss(oracle->forward(xs[s]), ys[s]).backward();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
  // Between steps the module holds exactly the plan's bytes: shards (padded) plus replicas.
  int64_t held = 0;
  for (const auto& p : net->parameters()) held += p.numel() * static_cast<int64_t>(sizeof(float));
  require(held == model.local_param_bytes(), "parameter bytes held: " + std::to_string(held) +
                                                 ", planned " +
                                                 std::to_string(model.local_param_bytes()));
  require_close_by_name(whole_parameters(model), *oracle, 1e-5, "sharded training");
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
DDP_TEST_WORKER(sharded_module_no_sync) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  shard::ShardOptions options;
  options.style = shard::parse_style(worker_env("DDP_TEST_STYLE"));
  const int64_t per_rank = 2, micro = 4, steps = 2;
  torch::manual_seed(0);
  auto net = make_net();
  torch::manual_seed(0);
  auto oracle = make_net();
  shard::FullyShardedDataParallel<torch::nn::Sequential> model(net, pg, options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(2);
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t m = 0; m < micro; ++m) {
      const auto x = torch::randn({w * per_rank, 5});
      const auto y = torch::randn({w * per_rank, 2});
      const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, r * per_rank, per_rank); };
      if (m + 1 < micro) {
        auto guard = model.no_sync();
        torch::mse_loss(model(mine(x)), mine(y)).backward();
        require(net->parameters()[0].size(0) == 6, "inside no_sync the parameters stay gathered");
      } else {
        torch::mse_loss(model(mine(x)), mine(y)).backward();
      }
      torch::mse_loss(oracle->forward(x), y).backward();
    }
    opt.step();
    opt.zero_grad();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
  require_close_by_name(whole_parameters(model), *oracle, 1e-5, "no_sync then a synchronized step");
}

class ShardedNoSyncTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedNoSyncTest, FullyShardAccumulatesThenReducesTheSum) {
  const auto result =
      run_workers("sharded_module_no_sync", GetParam(), {{"DDP_TEST_STYLE", "fully_shard"}});
  EXPECT_TRUE(result.ok()) << result.describe();
}

TEST_P(ShardedNoSyncTest, DefaultAccumulatesThenReducesTheSum) {
  const auto result =
      run_workers("sharded_module_no_sync", GetParam(), {{"DDP_TEST_STYLE", "default"}});
  EXPECT_TRUE(result.ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedNoSyncTest, ::testing::Values(1, 2, 3), world_name);

struct Case {
  std::string style, units;
  int world;
};

// Printed by gtest for a failing case instead of the struct's bytes.
void PrintTo(const Case& c, std::ostream* out) {
  *out << c.style << " units '" << c.units << "' world " << c.world;
}

class ShardedModuleTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedModuleTest, EqualsSingleProcessTrainingOnTheGlobalBatch) {
  const Case& c = GetParam();
  const auto result = run_workers("sharded_module_training", c.world,
                                  {{"DDP_TEST_STYLE", c.style}, {"DDP_TEST_UNITS", c.units}});
  EXPECT_TRUE(result.ok()) << result.describe();
}

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
