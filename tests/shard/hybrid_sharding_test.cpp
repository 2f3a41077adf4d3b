// Hybrid sharding (shard/sharded_module.hpp: fully_shard over a ("replicate", "shard") mesh) on
// Gloo at (2 x 2), (2 x 1), (1 x 2) and (3 x 1), FULLY_SHARD and DEFAULT: three steps of two
// micro-batches (the first under no_sync) end within 1e-5 of one process on the global batches;
// the layouts are over mesh {R, S}, replicated on dim 0; a comm hook takes the cross-replica
// average (PowerSGD refused by name); a hybrid checkpoint resumes as flat
// FULLY_SHARD, as DDP and as another hybrid mesh, and a flat one as hybrid, each ending where one
// uninterrupted process ends; over tensor parallelism on a 3-D mesh (1 x 2 x 2 and 2 x 1 x 2) the
// same equality, the gradient norm included; a mesh of other dims is refused by name.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/hooks/default_hooks.hpp"
#include "ddp/hooks/powersgd_hook.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/net.hpp"
#include "ddp/optim/grad_clip.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/tp/parallelize.hpp"
#include "support/error_text.hpp"
#include "support/oracle_twin.hpp"
#include "support/temp_dir.hpp"
#include "support/test_nets.hpp"
#include "support/training_state.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kDim = 7;  // uneven over 2, 3 and 4 shards; under DEFAULT replicated at 2

models::Workload net_workload() {
  models::WorkloadOptions options;
  options.dim = kDim;
  return make_test_workload("net", options);
}

TrainSpec spec_of(int steps) {
  TrainSpec spec;
  spec.model = "net";
  spec.dim = kDim;
  spec.steps = steps;
  spec.micro_batches = 2;
  return spec;
}

// "RxS" -> {R, S}.
std::pair<int64_t, int64_t> mesh_shape(const std::string& text) {
  const size_t x = text.find('x');
  return {std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
}

// A hybrid run: the ("replicate", "shard") dims of the mesh as "RxS", and the style.
struct MeshCase {
  std::string mesh, style;
  DDP_CASE_FIELDS(mesh, style)
};

DDP_TEST_WORKER_WITH(hybrid_oracle, MeshCase, c) {
  auto pg = worker_process_group();
  const auto [replicas, shards] = mesh_shape(c.mesh);
  const comm::DeviceMesh mesh(pg, {replicas, shards}, {"replicate", "shard"});
  const auto style = shard::parse_style(c.style);
  const TrainSpec spec = spec_of(3);
  const TrainResult got = train_data_parallel(spec, mesh, style);
  const TrainResult want = train_single(spec, 1);
  require_close(got.names, got.params, want.params, 1e-5,
                "hybrid " + c.mesh + " rank " + std::to_string(pg->rank()));

  // The layouts: mesh {R, S} at this rank's coordinate, nothing split across the replicas.
  auto net = net_workload();
  shard::ShardOptions options;
  options.style = style;
  shard::ShardedModule sharded(net.ptr, mesh, options);
  const layout::TensorLayouts& layouts = sharded.layouts();
  require(layouts.mesh == std::vector<int64_t>({replicas, shards}) &&
              layouts.coordinate == mesh.coordinate(),
          "hybrid layouts are not over the mesh");
  for (const auto& [name, l] : layouts.by_name) {
    for (const layout::Placement& p : l.placements) {
      require(p.mesh_dim == 1, "parameter '" + name + "' is split across the replicas");
    }
  }
  require(sharded.sharding().groups.size() == 2 && sharded.sharding().mesh_group == pg,
          "hybrid sharding's groups");
}

class HybridSharding : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(HybridSharding, EqualsOneProcessOnTheGlobalBatchWithAccumulation) {
  const auto& [mesh, style] = GetParam();
  const auto [replicas, shards] = mesh_shape(mesh);
  const auto result = run_workers(hybrid_oracle, int(replicas * shards), MeshCase{mesh, style});
  ASSERT_TRUE(result.ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(MeshesStyles, HybridSharding,
                         ::testing::Combine(::testing::Values("2x2", "2x1", "1x2", "3x1"),
                                            ::testing::Values("fully_shard", "default")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_" + std::get<0>(info.param);
                         });

// A run of `spec` as `run`: "RxS" (hybrid FULLY_SHARD), "flat" (FULLY_SHARD over the world) or
// "ddp". Phase "save": three steps, then a checkpoint under `root`; phase "resume": from other
// initial values, resume, three more steps, and compare with one process's six steps.
struct CheckpointCase {
  std::string run, phase, root;
  DDP_CASE_FIELDS(run, phase, root)
};

DDP_TEST_WORKER_WITH(hybrid_checkpoint, CheckpointCase, c) {
  auto pg = worker_process_group();
  const std::string& run = c.run;
  const bool resume = c.phase == "resume";
  std::optional<comm::DeviceMesh> mesh;
  if (run == "flat" || run == "ddp") {
    mesh.emplace(pg, std::vector<int64_t>{pg->world_size()}, std::vector<std::string>{"dp"});
  } else {
    const auto [replicas, shards] = mesh_shape(run);
    mesh.emplace(pg, std::vector<int64_t>{replicas, shards},
                 std::vector<std::string>{"replicate", "shard"});
  }
  const auto style = run == "ddp" ? parallel::DataParallelStyle::kReplicate
                                  : parallel::DataParallelStyle::kFullyShard;
  const TrainSpec spec = spec_of(3);
  auto w = net_workload();
  if (resume) {
    torch::NoGradGuard no_grad;
    for (auto& p : w.ptr->parameters()) p.fill_(0.5);  // overwritten by the checkpoint
  }
  auto model = parallel::data_parallel(w.module, *mesh, style);
  auto opt = make_test_optimizer(spec.optimizer, w.ptr->parameters(), spec.lr);
  io::TrainingState state = training_state(w.ptr.get(), opt.get(), model.sharding());
  io::CoordinatorOptions ckpt;
  ckpt.root = c.root;
  int first = 0;
  if (resume) {
    const auto entry = io::resume_latest(*pg, ckpt, state);
    require(entry && state.step == spec.steps, "did not resume from step 3");
    first = spec.steps;
  }
  const int64_t per_rank = spec.global_batch / pg->world_size();
  for (int step = first; step < first + spec.steps; ++step) {
    opt->zero_grad();
    for (int micro = 0; micro < spec.micro_batches; ++micro) {
      const int64_t offset = (step * spec.micro_batches + micro) * spec.global_batch;
      auto [x, y] = w.batch(offset + pg->rank() * per_rank, per_rank);
      if (micro + 1 < spec.micro_batches) {
        auto guard = model.no_sync();
        w.loss(model(x), y).backward();
      } else {
        w.loss(model(x), y).backward();
      }
    }
    opt->step();
  }
  if (!resume) {
    state.step = spec.steps;
    io::save_and_barrier(*pg, ckpt, state);
    return;
  }
  const io::TensorMap whole = io::whole_state(*w.ptr, model.sharding());
  const TrainResult want = train_single(spec_of(2 * spec.steps), 1);
  std::vector<torch::Tensor> got;
  for (const std::string& name : want.names) got.push_back(whole.at(name));
  require_close(want.names, got, want.params, 1e-5, "resumed as " + run);
}

struct Resume {
  std::string saved;
  int saved_world;
  std::string resumed;
  int resumed_world;
};

void PrintTo(const Resume& r, std::ostream* out) {
  *out << r.saved << "@" << r.saved_world << " -> " << r.resumed << "@" << r.resumed_world;
}

class HybridCheckpoint : public ::testing::TestWithParam<Resume> {};

TEST_P(HybridCheckpoint, ResumesOnAnotherMeshWhereOneProcessEnds) {
  const Resume& r = GetParam();
  TempDir root("hybrid_ckpt");
  auto result =
      run_workers(hybrid_checkpoint, r.saved_world, CheckpointCase{r.saved, "save", root.str()});
  ASSERT_TRUE(result.ok()) << result.describe();
  result = run_workers(hybrid_checkpoint, r.resumed_world,
                       CheckpointCase{r.resumed, "resume", root.str()});
  ASSERT_TRUE(result.ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(Runs, HybridCheckpoint,
                         ::testing::Values(Resume{"2x2", 4, "flat", 4}, Resume{"2x2", 4, "ddp", 2},
                                           Resume{"2x1", 2, "1x2", 2}, Resume{"flat", 3, "2x2", 4}),
                         [](const auto& info) {
                           const Resume& r = info.param;
                           return (r.saved == "flat" ? r.saved : "hybrid" + r.saved) + "_to_" +
                                  (r.resumed == "flat" || r.resumed == "ddp"
                                       ? r.resumed
                                       : "hybrid" + r.resumed);
                         });

// The built-in average through a hook, counting what it sees: under hybrid sharding the hook takes
// the cross-replica average of each unit's shard, not the reduce-scatter.
class CrossReplicaHook : public hooks::CommHook {
 public:
  explicit CrossReplicaHook(comm::ProcessGroupPtr replicate)
      : world_(replicate->world_size()), inner_(hooks::allreduce_hook(std::move(replicate))) {}
  c10::intrusive_ptr<c10::ivalue::Future> run(hooks::GradBucket& bucket) override {
    require(bucket.cross_replica && !bucket.reduce_scatter && bucket.world == world_,
            "the hook saw bucket " + std::to_string(bucket.index) + " as cross_replica " +
                std::to_string(bucket.cross_replica) + ", world " + std::to_string(bucket.world));
    ++(*calls);
    return inner_->run(bucket);
  }
  std::string name() const override { return "cross_replica_count"; }
  std::shared_ptr<int> calls = std::make_shared<int>(0);

 private:
  int world_;
  hooks::CommHookPtr inner_;
};

DDP_TEST_WORKER(hybrid_hook) {
  auto pg = worker_process_group();
  const comm::DeviceMesh mesh(pg, {2, 2}, {"replicate", "shard"});
  const TrainSpec spec = spec_of(3);
  auto hook = std::make_shared<CrossReplicaHook>(mesh["replicate"]);
  const std::shared_ptr<int> calls = hook->calls;
  const TrainResult got =
      train_data_parallel(spec, mesh, parallel::DataParallelStyle::kFullyShard, {}, hook);
  const TrainResult want = train_single(spec, 1);
  require_close(got.names, got.params, want.params, 1e-5, "hybrid through a hook");
  // One unit (the root), one synchronized backward a step.
  require(*calls == spec.steps, "the hook ran " + std::to_string(*calls) + " times");
  // PowerSGD needs whole gradients: refused by name at the first cross-replica average.
  auto net = net_workload();
  auto model = parallel::data_parallel(net.module, mesh, parallel::DataParallelStyle::kFullyShard);
  model.register_comm_hook(hooks::powersgd_hook(mesh["replicate"]));
  auto [x, y] = net.batch(0, 3);
  const std::string error = error_of([&] { net.loss(model(x), y).backward(); });
  require(error.find("ddp: comm hook 'powersgd' cannot average a unit's gradient shard across "
                     "replicas (hybrid sharding, bucket 0)") != std::string::npos,
          "powersgd under hybrid: " + error);
}

TEST(HybridShardingHook, AHookTakesTheCrossReplicaAverage) {
  const auto result = run_workers(hybrid_hook, 4);
  ASSERT_TRUE(result.ok()) << result.describe();
}

// Hybrid sharding over tensor parallelism: the 3-D mesh ("replicate", "shard", "tp") of the
// case's mesh "RxS" x 2. The Net's layers are split over "tp" (the seed plan), and
// data_parallel over the same mesh shards each layer's tp part within "shard" and averages across
// "replicate" (comm::submesh: the ranks of this rank's tp coordinate). Three steps of two
// micro-batches (the first under no_sync): the gradient norm of each step and the parameters
// after, whole by the nested layouts over {R, S, 2}, equal one process on the global batches.
DDP_TEST_WORKER_WITH(hybrid_tp, MeshCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const auto [replicas, shards] = mesh_shape(c.mesh);
  const int64_t tps = 2, dim = 8, dp = replicas * shards;
  const comm::DeviceMesh mesh(pg, {replicas, shards, tps}, {"replicate", "shard", "tp"});
  const int64_t dp_rank = mesh.coordinate()[0] * shards + mesh.coordinate()[1];
  torch::manual_seed(pg->rank());  // rank 0's values must reach every rank
  models::Net net(dim);
  torch::manual_seed(0);
  models::Net oracle(dim);
  auto tensor_parallel = tp::parallelize_module(net.ptr(), mesh["tp"],
                                                {{"fc1", tp::ColwiseParallel()},
                                                 {"fc2", tp::RowwiseParallel()},
                                                 {"fc3", tp::ColwiseParallel()},
                                                 {"fc4", tp::RowwiseParallel()}});
  parallel::DataParallelOptions options;
  options.shard.units = {"fc1", "fc2", "fc3", "fc4"};
  const auto style = shard::parse_style(c.style);
  auto model = parallel::data_parallel(net, mesh, style, options);
  const comm::Sharding sharding = model.sharding(*tensor_parallel, mesh.parent());
  require(sharding.layouts.mesh == mesh.shape() && sharding.layouts.coordinate == mesh.coordinate(),
          "the nested layouts are over the mesh {R, S, tp}");
  auto opt = make_test_optimizer("sgd", net->parameters());
  auto oracle_opt = make_test_optimizer("sgd", oracle->parameters());
  optim::ClipOptions no_clip;
  no_clip.max_norm = 1e9;
  torch::manual_seed(1);
  const int64_t per_dp = 3;
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      const auto x = torch::randn({per_dp * dp, dim});
      const auto y = torch::randn({per_dp * dp, dim});
      const auto mine = [&](const torch::Tensor& t) {
        return t.narrow(0, per_dp * dp_rank, per_dp);
      };
      if (micro == 0) {
        auto guard = model.no_sync();
        torch::mse_loss(model(mine(x)), mine(y)).backward();
      } else {
        torch::mse_loss(model(mine(x)), mine(y)).backward();
      }
      torch::mse_loss(oracle->forward(x), y).backward();
    }
    const double norm =
        optim::clip_grad_norm(parallel::grad_shards(*net, sharding, true), no_clip).norm();
    const double want = torch::nn::utils::clip_grad_norm_(oracle->parameters(), 1e9);
    require(std::abs(norm - want) <= 1e-5 * want, "step " + std::to_string(step) +
                                                      ": gradient norm " + std::to_string(norm) +
                                                      ", one process's " + std::to_string(want));
    opt->step();
    opt->zero_grad();
    oracle_opt->step();
    oracle_opt->zero_grad();
  }
  require_close_by_name(whole_parameters(*net, sharding), *oracle, 1e-5,
                        "hybrid " + c.mesh + " x tp 2, rank " + std::to_string(pg->rank()));
}

class HybridOverTensorParallel
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(HybridOverTensorParallel, EqualsOneProcessOnTheGlobalBatchWithAccumulation) {
  const auto& [mesh, style] = GetParam();
  const auto [replicas, shards] = mesh_shape(mesh);
  const auto result = run_workers(hybrid_tp, int(replicas * shards * 2), MeshCase{mesh, style}, {},
                                  std::chrono::seconds(240));
  ASSERT_TRUE(result.ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(Meshes, HybridOverTensorParallel,
                         ::testing::Values(std::make_tuple("1x2", "fully_shard"),
                                           std::make_tuple("2x1", "fully_shard"),
                                           std::make_tuple("2x1", "default")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_" + std::get<0>(info.param) + "x2";
                         });

DDP_TEST_WORKER(hybrid_wrong_mesh) {
  auto pg = worker_process_group();
  const comm::DeviceMesh mesh(pg, {1, 2}, {"shard", "replicate"});
  auto net = net_workload();
  const std::string error = error_of([&] { (void)shard::ShardedModule(net.ptr, mesh); });
  require(error ==
              "ddp: hybrid sharding takes a 2-D mesh with dims (\"replicate\", \"shard\"); "
              "this mesh's dims are (\"shard\", \"replicate\")",
          "wrong mesh: " + error);
  pg->barrier("mesh built on every rank");
}

TEST(HybridShardingMesh, AMeshOfOtherDimsIsRefusedByName) {
  const auto result = run_workers(hybrid_wrong_mesh, 2);
  ASSERT_TRUE(result.ok()) << result.describe();
}

}  // namespace
}  // namespace ddp::testing
