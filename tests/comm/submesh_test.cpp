// comm::submesh: over a 2 x 1 x 2 mesh ("replicate", "shard", "tp") of 4 processes, the mesh of
// ("replicate", "shard") is the ranks of this rank's tp coordinate, row-major, with sub-groups
// that reduce among those ranks only; dims out of the mesh's order, unknown or none are refused
// naming the mesh's dims.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/comm/submesh.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

DDP_TEST_WORKER(submesh_2x1x2) {
  auto world = worker_process_group(std::chrono::seconds(60));
  const int g = world->rank();
  const comm::DeviceMesh mesh(world, {2, 1, 2}, {"replicate", "shard", "tp"});
  const comm::DeviceMesh dp = comm::submesh(mesh, {"replicate", "shard"});
  // g = 2 * replicate + tp: the sub-mesh of tp coordinate t holds ranks {t, 2 + t}.
  const int tp = g % 2, replica = g / 2;
  require(dp.shape() == std::vector<int64_t>({2, 1}) &&
              dp.dim_names() == std::vector<std::string>({"replicate", "shard"}),
          "the sub-mesh's shape and dims");
  require(dp.coordinate() == std::vector<int64_t>({replica, 0}), "the sub-mesh coordinate");
  require(dp.parent()->global_ranks() == std::vector<int>({tp, 2 + tp}),
          "the sub-mesh's ranks are those of tp coordinate " + std::to_string(tp));
  // Its "replicate" group sums its own members' ranks only: tp + (2 + tp).
  auto t = torch::full({2}, static_cast<float>(g));
  dp["replicate"]->allreduce_sum(t, "replicate all-reduce");
  require(t.eq(static_cast<float>(2 * tp + 2)).all().item<bool>(),
          "replicate all-reduce: expected " + std::to_string(2 * tp + 2));
  // One dim: the ranks that share every other coordinate, as the mesh's own group of that dim.
  const comm::DeviceMesh tps = comm::submesh(mesh, {"tp"});
  require(tps.parent()->global_ranks() == mesh["tp"]->global_ranks(), "submesh {tp}");

  const std::string order = error_of([&] { comm::submesh(mesh, {"shard", "replicate"}); });
  require(order ==
              "ddp: submesh of dims [shard, replicate]: each must be a distinct dim of the mesh, "
              "in its order [replicate, shard, tp]",
          "order: " + order);
  const std::string unknown = error_of([&] { comm::submesh(mesh, {"pp"}); });
  require(unknown ==
              "ddp: submesh of dims [pp]: each must be a distinct dim of the mesh, in its order "
              "[replicate, shard, tp]",
          "unknown: " + unknown);
  const std::string none = error_of([&] { comm::submesh(mesh, {}); });
  require(none == "ddp: submesh needs at least one dim of [replicate, shard, tp]", "none: " + none);
  world->barrier("end of submesh test");
}

TEST(Submesh, KeepsTheRanksOfThisRanksOtherCoordinates) {
  EXPECT_WORKERS_PASS(run_workers(submesh_2x1x2, 4, {}, {}, std::chrono::seconds(240)));
}

}  // namespace
}  // namespace ddp::testing
