// DeviceMesh: a 2x2 mesh over 4 processes; its "dp" and "tp" sub-groups all-reduce
// independently, map group ranks to global ranks, and never read each other's store keys.

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "ddp/comm/device_mesh.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

DDP_TEST_WORKER(mesh_2x2) {
  auto world = worker_process_group(std::chrono::seconds(60));
  const int g = world->rank();
  comm::DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
  // Row-major: g = 2 * dp + tp.
  const int64_t dp = g / 2, tp = g % 2;
  require(mesh.coordinate() == std::vector<int64_t>{dp, tp},
          "coordinate of rank " + std::to_string(g));
  require(mesh.size("dp") == 2 && mesh.size("tp") == 2 && mesh.size() == 4, "mesh sizes");
  const auto& dp_group = mesh["dp"];        // ranks with the same tp: {tp, 2 + tp}
  const auto& tp_group = mesh.group("tp");  // ranks with the same dp: {2dp, 2dp + 1}
  require(dp_group->world_size() == 2 && dp_group->rank() == dp, "dp group rank");
  require(tp_group->world_size() == 2 && tp_group->rank() == tp, "tp group rank");
  require(
      dp_group->global_ranks() == std::vector<int>{static_cast<int>(tp), static_cast<int>(2 + tp)},
      "dp group's global ranks");
  require(tp_group->global_ranks() ==
              std::vector<int>{static_cast<int>(2 * dp), static_cast<int>(2 * dp + 1)},
          "tp group's global ranks");
  require(tp_group->global_rank() == g && world->global_rank(3) == 3, "global rank mapping");

  // Both groups' all-reduces in flight at once: each sums only its own members' global ranks.
  auto across_dp = torch::full({3}, static_cast<float>(g));
  auto across_tp = torch::full({3}, static_cast<float>(g));
  auto dp_work = dp_group->allreduce_sum_async(across_dp);
  auto tp_work = tp_group->allreduce_sum_async(across_tp);
  tp_group->wait(tp_work, "tp all-reduce");
  dp_group->wait(dp_work, "dp all-reduce");
  require(across_dp.eq(static_cast<float>(2 * tp + 2)).all().item<bool>(),
          "dp all-reduce: expected " + std::to_string(2 * tp + 2));
  require(across_tp.eq(static_cast<float>(4 * dp + 1)).all().item<bool>(),
          "tp all-reduce: expected " + std::to_string(4 * dp + 1));
  // A reduce-scatter on a sub-group: 3 elements over 2 ranks (2, 1).
  const auto shard = tp_group->reduce_scatter(torch::full({3}, static_cast<float>(g)),
                                              comm::ReduceOp::kSum, "tp reduce-scatter");
  require(shard.numel() == (tp == 0 ? 2 : 1) && shard.eq(4.0f * dp + 1).all().item<bool>(),
          "tp reduce-scatter shard");

  // The same keys written by every group: each group must read back its own members' values.
  for (const comm::ProcessGroupPtr& group : {world, dp_group, tp_group}) {
    auto& pg = *group;
    const std::string prefix = "test/exchange/" + std::to_string(pg.next_exchange_id()) + "/";
    const std::string mine = std::to_string(g);
    pg.store().set(prefix + std::to_string(pg.rank()),
                   std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < pg.world_size(); ++r) {
      const std::string got = text_of(pg.store().get(prefix + std::to_string(r)));
      require(got == std::to_string(pg.global_rank(r)),
              "group '" + pg.prefix() + "' read '" + got + "' for its rank " + std::to_string(r) +
                  ", expected global rank " + std::to_string(pg.global_rank(r)));
    }
  }
  require(dp_group->prefix() == "ddp/world/mesh0/dp/" + std::to_string(tp) &&
              tp_group->prefix() == "ddp/world/mesh0/tp/" + std::to_string(dp),
          "sub-group prefixes: " + dp_group->prefix() + ", " + tp_group->prefix());
  world->barrier("end of mesh test");
}

TEST(DeviceMesh, TwoByTwoSubGroupsReduceIndependentlyWithoutKeyCollisions) {
  EXPECT_WORKERS_PASS(run_workers(mesh_2x2, 4, {}, {}, std::chrono::seconds(240)));
}

DDP_TEST_WORKER(mesh_errors) {
  auto world = worker_process_group(std::chrono::seconds(60));
  const std::string wrong_size = error_of([&] { comm::DeviceMesh(world, {2, 2}, {"dp", "tp"}); });
  require(wrong_size ==
              "ddp: DeviceMesh shape [2, 2] holds 4 ranks, but the process group has 1: the "
              "product of the shape must equal the world size",
          "shape error: " + wrong_size);
  comm::DeviceMesh mesh(world, {1, 1}, {"dp", "tp"});
  const std::string unknown = error_of([&] { mesh.size("pp"); });
  require(unknown == "ddp: DeviceMesh has no dim 'pp'; its dims are [dp, tp]",
          "unknown dim error: " + unknown);
  const std::string names = error_of([&] { comm::DeviceMesh(world, {1, 1}, {"dp", "dp"}); });
  require(names.find("dim names must be distinct") != std::string::npos, "names: " + names);
  auto t = torch::ones({2});
  mesh["tp"]->allreduce_sum(t, "size-1 group");
  require(t.eq(1.0f).all().item<bool>(), "a size-1 group's all-reduce changed the tensor");
}

TEST(DeviceMesh, ErrorsNameTheShapeAndTheDims) { EXPECT_WORKERS_PASS(run_workers(mesh_errors, 1)); }

// The same sub-group construction on NCCL (the device machine): a 2x1 mesh over 2 GPUs, so "dp"
// is one NCCL communicator of both ranks and each "tp" group holds one rank.
DDP_TEST_WORKER(mesh_nccl) {
  const int local_rank = std::stoi(worker_env("LOCAL_RANK", "0"));
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->setDevice(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank)));
  auto world = worker_process_group(std::chrono::seconds(60), "nccl");
  const int g = world->rank();
  comm::DeviceMesh mesh(world, {2, 1}, {"dp", "tp"});
  const auto& dp_group = mesh["dp"];
  const auto& tp_group = mesh["tp"];
  require(dp_group->world_size() == 2 && dp_group->rank() == g, "dp group rank");
  require(tp_group->world_size() == 1 && tp_group->global_rank(0) == g, "tp group rank");
  const auto device = world->device();
  require(device.is_cuda() && dp_group->device() == device, "groups on this rank's GPU");
  auto across_dp = torch::full({5}, static_cast<float>(g + 1), torch::TensorOptions(device));
  auto alone = torch::full({5}, static_cast<float>(g + 1), torch::TensorOptions(device));
  auto dp_work = dp_group->allreduce_sum_async(across_dp);
  auto tp_work = tp_group->allreduce_sum_async(alone);
  tp_group->wait(tp_work, "tp all-reduce");
  dp_group->wait(dp_work, "dp all-reduce");
  require(across_dp.eq(3.0f).all().item<bool>(), "dp all-reduce: expected 1 + 2");
  require(alone.eq(static_cast<float>(g + 1)).all().item<bool>(), "size-1 tp all-reduce");
  const auto shard = dp_group->reduce_scatter(torch::full({3}, 1.0f, torch::TensorOptions(device)),
                                              comm::ReduceOp::kAvg, "dp reduce-scatter");
  require(shard.numel() == (g == 0 ? 2 : 1) && shard.eq(1.0f).all().item<bool>(),
          "dp reduce-scatter average");
  world->barrier("end of NCCL mesh test");
}

TEST(DeviceMeshNccl, TwoByOneSubGroupsOnGpus) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  EXPECT_WORKERS_PASS(run_workers(mesh_nccl, 2, {}, {{"NCCL_NVLS_ENABLE", "0"}}));
}

}  // namespace
}  // namespace ddp::testing
