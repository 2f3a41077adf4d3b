// comm::Sharding: a runtime's layouts with the groups they are over. On a 2x2 mesh of 4 processes:
// whole_over and nest in closed form (mesh, coordinate, groups in mesh order, the mesh group), the
// invariants refused by exact text, and an export of a nested sharding without its mesh group
// refused by name; every wrapper answers the same shape (data_parallel's styles over "dp").

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// `got` must be `want` exactly: a worker's assertion naming `what`.
void require_text(const std::string& got, const std::string& want, const std::string& what) {
  require(got == want, what + ": got '" + got + "', want '" + want + "'");
}

DDP_TEST_WORKER(sharding_2x2) {
  auto world = worker_process_group(std::chrono::seconds(60));
  comm::DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
  const int64_t dp = mesh.coordinate()[0], tp = mesh.coordinate()[1];

  // Nothing split over the world: mesh {4} at this rank, the world its group and mesh group.
  const comm::Sharding whole = comm::whole_over(world);
  require(whole.layouts.mesh == std::vector<int64_t>{4} &&
              whole.layouts.coordinate == std::vector<int64_t>{world->rank()} &&
              whole.layouts.by_name.empty() && whole.groups == std::vector{world} &&
              whole.mesh_group == world,
          "whole_over(world)");
  const comm::Sharding alone = comm::whole_over(nullptr);
  require(
      alone.layouts.mesh == std::vector<int64_t>{1} && alone.groups.empty() && !alone.mesh_group,
      "whole_over(null): one process");
  comm::check_sharding(whole, "test");
  comm::check_sharding(alone, "test");

  // A weight split on dim 0 over "tp" (inner), nothing split over "dp" (outer): nested, the mesh
  // and coordinate are outer's then inner's, and so are the groups.
  comm::Sharding inner;
  inner.layouts.mesh = {2};
  inner.layouts.coordinate = {tp};
  inner.layouts.by_name["w"] = layout::Layout{{6, 3}, {2}, {layout::Placement::shard(0, 0)}};
  inner.groups = {mesh["tp"]};
  inner.mesh_group = mesh["tp"];
  const comm::Sharding nested = comm::nest(inner, comm::whole_over(mesh["dp"]), world);
  require(nested.layouts.mesh == std::vector<int64_t>{2, 2} &&
              nested.layouts.coordinate == std::vector<int64_t>{dp, tp} &&
              nested.groups == std::vector{mesh["dp"], mesh["tp"]} && nested.mesh_group == world,
          "nest: mesh {dp, tp}, coordinate, groups {dp, tp}, the world as the mesh group");
  const layout::Layout w = nested.layouts.of("w", {6, 3});
  require(w.placements.size() == 1 && w.placements[0].mesh_dim == 1,
          "nest: w stays split over the tp dim, now mesh dim 1");
  comm::check_sharding(nested, "test");

  // The invariants, refused by exact text.
  comm::Sharding wrong = nested;
  wrong.groups = {world, mesh["tp"]};
  require_text(error_of([&] { comm::check_sharding(wrong, "test"); }),
               "ddp: test: mesh dim 0 has 2 ranks and this rank at " + std::to_string(dp) +
                   ", but its group has 4 ranks and this rank at " + std::to_string(world->rank()),
               "a group of another size than its mesh dim");
  wrong.groups = {mesh["dp"]};
  require_text(error_of([&] { comm::check_sharding(wrong, "test"); }),
               "ddp: test: 1 groups for a mesh of 2 dims: a sharding carries this rank's group "
               "along each mesh dim",
               "one group for two dims");
  wrong = nested;
  wrong.mesh_group = mesh["tp"];
  require_text(error_of([&] { comm::check_sharding(wrong, "test"); }),
               "ddp: test: the mesh group has 2 ranks for a mesh of 4", "a mesh group too small");

  // An export of a nested sharding without its mesh group names the fix.
  torch::nn::Linear net(3, 6);
  comm::Sharding norm_only = nested;
  norm_only.mesh_group = nullptr;
  require_text(error_of([&] { io::whole_state(*net, norm_only); }),
               "ddp: whole_state: the sharding is over the 2-D mesh [2, 2] without that mesh's "
               "group; take it with the mesh's parent group, e.g. model.sharding(*tp, "
               "mesh.parent())",
               "an export without the mesh group");

  // Every style answers the same shape: its layouts over mesh {dp} with the dp group.
  for (const auto style : {DataParallelStyle::kReplicate, DataParallelStyle::kFullyShard,
                           DataParallelStyle::kDefault}) {
    torch::manual_seed(0);
    auto model = ddp::data_parallel(torch::nn::Linear(4, 2), mesh, style);
    const comm::Sharding got = model.sharding();
    require(got.layouts.mesh == std::vector<int64_t>{2} &&
                got.layouts.coordinate == std::vector<int64_t>{dp} &&
                got.groups == std::vector{mesh["dp"]} && got.mesh_group == mesh["dp"] &&
                got.layouts.by_name.size() == model.layouts().by_name.size(),
            "a style's sharding: its layouts over the dp group");
  }
  world->barrier("end of sharding test");
}

TEST(Sharding, NestsGroupsInMeshOrderAndRefusesWhatDoesNotFitByName) {
  EXPECT_WORKERS_PASS(run_workers(sharding_2x2, 4, {}, {}, std::chrono::seconds(240)));
}

}  // namespace
}  // namespace ddp::testing
