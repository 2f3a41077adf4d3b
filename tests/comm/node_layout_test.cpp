// comm::node_layout_from_env reads each launcher's node size and local rank (ddp-run/torchrun,
// mpirun, srun's two forms) and refuses what cannot be a node layout by name; node_count and
// node_mesh at world 4 with 2 ranks per node give 2 nodes and the (2 x 2) ("replicate", "shard")
// mesh whose shard groups are each node's ranks; a rank numbered out of node order is named on
// every rank.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "ddp/comm/node_layout.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

comm::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(NodeLayout, EachLauncherSaysTheNodeSizeAndTheLocalRank) {
  const auto torchrun = comm::node_layout_from_env(
      env_of({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}), 8);
  EXPECT_EQ(torchrun.ranks_per_node, 4);
  EXPECT_EQ(torchrun.local_rank, 1);
  const auto mpi = comm::node_layout_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                                              6);
  EXPECT_EQ(mpi.ranks_per_node, 2);
  EXPECT_EQ(mpi.local_rank, 1);
  const auto srun = comm::node_layout_from_env(
      env_of({{"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "4"}}), 8);
  EXPECT_EQ(srun.ranks_per_node, 4);
  EXPECT_EQ(srun.local_rank, 2);
  const auto tasks = comm::node_layout_from_env(
      env_of({{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "1(x3)"}}),
      3);
  EXPECT_EQ(tasks.ranks_per_node, 1);
  EXPECT_EQ(tasks.local_rank, 0);
  // No launcher: one node of every rank, the local rank not said.
  const auto none = comm::node_layout_from_env(env_of({}), 3);
  EXPECT_EQ(none.ranks_per_node, 3);
  EXPECT_EQ(none.local_rank, -1);
  // A launcher without the node size (RANK set by hand): one node too.
  EXPECT_EQ(comm::node_layout_from_env(env_of({{"RANK", "0"}}), 2).ranks_per_node, 2);
}

TEST(NodeLayout, WhatCannotBeANodeLayoutIsRefusedByName) {
  const auto error = [](std::map<std::string, std::string> vars, int64_t world) {
    return error_of([&] { comm::node_layout_from_env(env_of(std::move(vars)), world); });
  };
  EXPECT_EQ(error({{"RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}}, 4),
            "ddp: 3 ranks per node (LOCAL_WORLD_SIZE) do not divide the world size 4");
  EXPECT_EQ(error({{"RANK", "0"}, {"LOCAL_WORLD_SIZE", "two"}}, 4),
            "ddp: environment variable LOCAL_WORLD_SIZE='two' is invalid: expected an integer in "
            "[1, 4]");
  EXPECT_EQ(error({{"RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}, 4),
            "ddp: environment variable LOCAL_RANK='2' is invalid: expected an integer in [0, 1]");
  EXPECT_EQ(error({{"SLURM_PROCID", "0"}, {"SLURM_TASKS_PER_NODE", "4(x2),2"}}, 10),
            "ddp: environment variable SLURM_TASKS_PER_NODE='4(x2),2' gives nodes of different "
            "sizes; hybrid sharding by node needs every node alike");
}

struct NodeOrderCase {
  // "good" (local rank = rank % 2) or "swapped" (ranks 2 and 3 say each other's local rank).
  std::string node_order = "good";
  DDP_CASE_FIELDS(node_order)
};

DDP_TEST_WORKER_WITH(node_mesh_2x2, NodeOrderCase, c) {
  auto world = worker_process_group(std::chrono::seconds(60));
  const int g = world->rank();
  const bool swapped = c.node_order == "swapped";
  const int local = swapped && g >= 2 ? 1 - g % 2 : g % 2;
  const auto env = env_of({{"RANK", std::to_string(g)},
                           {"LOCAL_RANK", std::to_string(local)},
                           {"LOCAL_WORLD_SIZE", "2"}});
  if (swapped) {
    const std::string error = error_of([&] { comm::node_mesh(world, env); });
    require(error ==
                "ddp: rank 2 is local rank 1 of its node, but ranks numbered node by node (2 per "
                "node) put it at local rank 0: hybrid sharding by node needs each node's ranks "
                "consecutive (ddp-run, torchrun and srun's block distribution number them so)",
            "swapped: " + error);
    return;
  }
  require(comm::node_count(world, env) == 2, "node count");
  const comm::DeviceMesh mesh = comm::node_mesh(world, env);
  require(mesh.shape() == std::vector<int64_t>({2, 2}) &&
              mesh.dim_names() == std::vector<std::string>({"replicate", "shard"}),
          "the node mesh");
  // The shard group is this node's ranks: {0, 1} or {2, 3}.
  const int node = g / 2;
  require(mesh["shard"]->global_ranks() == std::vector<int>({2 * node, 2 * node + 1}),
          "the shard group is node " + std::to_string(node) + "'s ranks");
}

TEST(NodeLayout, TheNodeMeshShardsWithinANode) {
  EXPECT_WORKERS_PASS(run_workers(node_mesh_2x2, 4, NodeOrderCase{"good"}));
}

TEST(NodeLayout, ARankOutOfNodeOrderIsNamedOnEveryRank) {
  EXPECT_WORKERS_PASS(run_workers(node_mesh_2x2, 4, NodeOrderCase{"swapped"}));
}

}  // namespace
}  // namespace ddp::testing
