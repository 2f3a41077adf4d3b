// Checkpoints by the wrappers' sharding (TrainingState::sharding, io/checkpoint.hpp) on Gloo:
// FULLY_SHARD over tensor parallelism, saved at (dp 2, tp 2) through save_and_barrier with the
// nested layouts, resumes as a plain model at world 1, as TP 1x2 and as FULLY_SHARD at world 3;
// each resumed run ends within 1e-5 of the uninterrupted (dp 2, tp 2) run on the same global
// batches, with each optimizer a checkpoint holds: SGD momentum, Adam, AdamW in the GPT recipe's
// two groups (weight decay on the 2-D parameters only), RMSprop (momentum, centered) and Adagrad
// (their state travels with the parameters, split by the same layouts; the groups by name). And a
// replicated (DDP) checkpoint saved at world 2 resumes as DDP and as FULLY_SHARD at world 3.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/checkpoint_manifest.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/net.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/tp/parallelize.hpp"
#include "support/oracle.hpp"
#include "support/temp_dir.hpp"
#include "support/training_state.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kDim = 8;      // divides by the tp sizes 1 and 2
constexpr int64_t kGlobal = 12;  // the global batch: divides by the dp sizes 1, 2 and 3
constexpr int64_t kSaved = 2;    // steps before the checkpoint
constexpr int64_t kSteps = 4;    // steps in all

tp::TpPlan seed_plan() {
  return {{"fc1", tp::ColwiseParallel()},
          {"fc2", tp::RowwiseParallel()},
          {"fc3", tp::ColwiseParallel()},
          {"fc4", tp::RowwiseParallel()}};
}

shard::ShardOptions per_layer() {
  shard::ShardOptions options;
  options.units = {"fc1", "fc2", "fc3", "fc4"};
  return options;
}

// One save and its resumes.
struct Case {
  std::string dir;        // holds the checkpoint root and the uninterrupted run's final parameters
  std::string optimizer;  // "sgd", "adam", "adamw", "rmsprop" or "adagrad"
  std::string saved;      // how the checkpoint was saved, for the resume's messages
  std::string as;         // how layout_checkpoint_resume resumes
  DDP_CASE_FIELDS(dir, optimizer, saved, as)
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params,
                                                        const std::string& kind) {
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  }
  if (kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(optim::weight_decay_groups(
        params, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1)));
  }
  if (kind == "rmsprop") {
    return std::make_unique<torch::optim::RMSprop>(
        params, torch::optim::RMSpropOptions(1e-3).momentum(0.9).centered(true));
  }
  if (kind == "adagrad") {
    return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(0.05));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// Steps [first, last) on the global batches of those steps, this dp rank's rows of each.
template <typename Forward>
void train(Forward forward, torch::optim::Optimizer& opt, int64_t first, int64_t last, int dp,
           int dp_rank) {
  const int64_t rows = kGlobal / dp;
  for (int64_t s = first; s < last; ++s) {
    torch::manual_seed(100 + s);
    const auto x = torch::randn({kGlobal, kDim}).narrow(0, dp_rank * rows, rows);
    const auto y = torch::randn({kGlobal, kDim}).narrow(0, dp_rank * rows, rows);
    torch::mse_loss(forward(x), y).backward();
    opt.step();
    opt.zero_grad();
  }
}

std::string checkpoint_root(const Case& c) { return c.dir + "/ckpt"; }
std::string reference_file(const Case& c) { return c.dir + "/uninterrupted.safetensors"; }

// The uninterrupted run at (dp 2, tp 2): saves after kSaved steps, writes its final parameters.
DDP_TEST_WORKER_WITH(layout_checkpoint_save, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  comm::DeviceMesh mesh(pg, {2, 2}, {"dp", "tp"});
  torch::manual_seed(0);
  models::Net net(kDim);
  auto tensor_parallel = tp::parallelize_module(net.ptr(), mesh["tp"], seed_plan());
  shard::FullyShardedDataParallel<models::Net> sharded(net, mesh["dp"], per_layer());
  auto opt = make_optimizer(net->parameters(), c.optimizer);
  const int dp_rank = static_cast<int>(mesh.coordinate()[0]);
  const auto forward = [&](const torch::Tensor& x) { return sharded(x); };
  train(forward, *opt, 0, kSaved, 2, dp_rank);
  // FULLY_SHARD over "dp" nested on TP's split over "tp", over the world group (the mesh's).
  const comm::Sharding sharding = comm::nest(tensor_parallel->sharding(), sharded.sharding(), pg);
  io::TrainingState state = training_state(net.ptr().get(), opt.get());
  state.step = kSaved;
  state.data_position = kSaved * kGlobal;
  state.sharding = sharding;
  io::CoordinatorOptions where;
  where.root = checkpoint_root(c);
  io::save_and_barrier(*pg, where, state);
  train(forward, *opt, kSaved, kSteps, 2, dp_rank);
  const io::TensorMap whole = io::whole_state(*net, sharding);
  if (pg->rank() == 0) io::save_safetensors(reference_file(c), whole);
  pg->barrier("reference written");
}

// The uninterrupted replicated run: DDP at world 2, saves after kSaved steps (every tensor whole,
// no layouts), writes its final parameters.
DDP_TEST_WORKER_WITH(layout_checkpoint_save_ddp, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  torch::manual_seed(0);
  models::Net net(kDim);
  parallel::DistributedDataParallel<models::Net> ddp(net, pg);
  auto opt = make_optimizer(net->parameters(), c.optimizer);
  const auto forward = [&](const torch::Tensor& x) { return ddp(x); };
  train(forward, *opt, 0, kSaved, pg->world_size(), pg->rank());
  io::TrainingState state = training_state(net.ptr().get(), opt.get());
  state.step = kSaved;
  state.data_position = kSaved * kGlobal;
  io::CoordinatorOptions where;
  where.root = checkpoint_root(c);
  io::save_and_barrier(*pg, where, state);
  train(forward, *opt, kSaved, kSteps, pg->world_size(), pg->rank());
  const io::TensorMap whole = io::whole_state(*net, layout::TensorLayouts{}, nullptr);
  if (pg->rank() == 0) io::save_safetensors(reference_file(c), whole);
  pg->barrier("reference written");
}

// Resumes the checkpoint as c.as: "plain" (world 1), "tp" (TP 1x2), "fully_shard"
// (world 3), "ddp" (DDP at world 3), trains to kSteps and compares with the uninterrupted run.
DDP_TEST_WORKER_WITH(layout_checkpoint_resume, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const std::string& as = c.as;
  torch::manual_seed(7 + pg->rank());  // values the load must replace
  models::Net net(kDim);
  std::unique_ptr<comm::DeviceMesh> mesh;
  std::unique_ptr<tp::TensorParallel> tensor_parallel;
  std::unique_ptr<shard::FullyShardedDataParallel<models::Net>> sharded;
  std::unique_ptr<parallel::DistributedDataParallel<models::Net>> ddp;
  io::TrainingState state;
  state.model = net.ptr().get();
  int dp = 1, dp_rank = 0;
  if (as == "tp") {
    mesh = std::make_unique<comm::DeviceMesh>(pg, std::vector<int64_t>{1, 2},
                                              std::vector<std::string>{"dp", "tp"});
    tensor_parallel = tp::parallelize_module(net.ptr(), (*mesh)["tp"], seed_plan());
    // The mesh {1, 2}: dp is one rank, so tp's layouts are over the whole group.
    state.sharding = tensor_parallel->sharding();
  } else if (as == "fully_shard") {
    sharded = std::make_unique<shard::FullyShardedDataParallel<models::Net>>(net, pg, per_layer());
    state.sharding = sharded->sharding();
    dp = pg->world_size();
    dp_rank = pg->rank();
  } else if (as == "ddp") {
    ddp = std::make_unique<parallel::DistributedDataParallel<models::Net>>(net, pg);
    dp = pg->world_size();
    dp_rank = pg->rank();
  }
  auto opt = make_optimizer(net->parameters(), c.optimizer);
  state.optimizer = opt.get();
  io::CoordinatorOptions where;
  where.root = checkpoint_root(c);
  const auto entry = io::resume_latest(*pg, where, state);
  require(entry.has_value() && state.step == kSaved && state.data_position == kSaved * kGlobal,
          as + ": resumed at step " + std::to_string(state.step));
  const auto forward = [&](const torch::Tensor& x) {
    return sharded ? (*sharded)(x) : ddp ? (*ddp)(x) : net->forward(x);
  };
  train(forward, *opt, kSaved, kSteps, dp, dp_rank);
  // The export by the same sharding the load used (none: every parameter whole here).
  const io::TensorMap whole =
      io::whole_state(*net, state.sharding ? *state.sharding : comm::whole_over(nullptr));
  const io::TensorMap want = io::load_safetensors(reference_file(c));
  std::vector<std::string> names;
  std::vector<torch::Tensor> got, expected;
  for (const auto& [name, t] : want) {
    names.push_back(name);
    got.push_back(whole.at(name));
    expected.push_back(t);
  }
  require_close(names, got, expected, 1e-5, as + " resumed from " + c.saved + ", " + c.optimizer);
}

class LayoutCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(LayoutCheckpoint, FullyShardOverTpResumesAsPlainTpAndFullyShard) {
  TempDir dir;
  Case c;
  c.dir = dir.str();
  c.optimizer = GetParam();
  c.saved = "(dp 2, tp 2) FULLY_SHARD x TP";
  const auto saved = run_workers(layout_checkpoint_save, 4, c);
  ASSERT_TRUE(saved.ok()) << saved.describe();
  // The format: every rank wrote its pieces, and the manifest gives each split tensor's layout
  // over the (dp 2, tp 2) mesh: TP's split first, FULLY_SHARD's dim-0 split of what TP left.
  const io::Manifest m = io::verify_checkpoint(io::checkpoint_dir(dir.str() + "/ckpt", kSaved));
  EXPECT_EQ(m.format_version, 2);
  EXPECT_EQ(m.world_size, 4);
  std::set<std::string> rank_files;
  for (const auto& f : m.files)
    if (f.rank != io::kReplicated) rank_files.insert(f.name);
  EXPECT_EQ(rank_files.size(), 8u);  // model and optimizer pieces of 4 ranks
  using layout::Placement;
  const std::map<std::string, std::vector<Placement>> want = {
      {"fc1.weight", {Placement::shard(1, 0), Placement::shard(0, 0)}},  // colwise
      {"fc1.bias", {Placement::shard(1, 0), Placement::shard(0, 0)}},
      {"fc2.weight", {Placement::shard(1, 1), Placement::shard(0, 0)}},  // rowwise
      {"fc2.bias", {Placement::shard(0, 0)}},                            // whole over tp
      {"fc3.weight", {Placement::shard(1, 0), Placement::shard(0, 0)}},
      {"fc3.bias", {Placement::shard(1, 0), Placement::shard(0, 0)}},
      {"fc4.weight", {Placement::shard(1, 1), Placement::shard(0, 0)}},
      {"fc4.bias", {Placement::shard(0, 0)}}};
  std::map<std::string, std::vector<Placement>> got;
  for (const io::ShardedTensor& t : m.sharded) {
    EXPECT_EQ(t.layout.mesh, (std::vector<int64_t>{2, 2})) << t.name;
    got[t.name] = t.layout.placements;
  }
  EXPECT_EQ(got, want);
  for (const auto& [as, world] :
       std::vector<std::pair<std::string, int>>{{"plain", 1}, {"tp", 2}, {"fully_shard", 3}}) {
    c.as = as;
    const auto resumed = run_workers(layout_checkpoint_resume, world, c);
    EXPECT_TRUE(resumed.ok()) << as << ": " << resumed.describe();
  }
}

// A replicated (DDP) checkpoint saved at world 2 resumes as DDP and as FULLY_SHARD at world 3, as
// PyTorch's does (issue 26 item 6), with each optimizer's state whole in one file.
TEST_P(LayoutCheckpoint, ReplicatedResumesAsDdpAndFullyShardAtThree) {
  TempDir dir;
  Case c;
  c.dir = dir.str();
  c.optimizer = GetParam();
  c.saved = "DDP at world 2";
  const auto saved = run_workers(layout_checkpoint_save_ddp, 2, c);
  ASSERT_TRUE(saved.ok()) << saved.describe();
  const io::Manifest m = io::verify_checkpoint(io::checkpoint_dir(dir.str() + "/ckpt", kSaved));
  EXPECT_TRUE(m.sharded.empty());
  for (const std::string as : {"ddp", "fully_shard"}) {
    c.as = as;
    const auto resumed = run_workers(layout_checkpoint_resume, 3, c);
    EXPECT_TRUE(resumed.ok()) << as << ": " << resumed.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, LayoutCheckpoint,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad"));

}  // namespace
}  // namespace ddp::testing
