#pragma once
// The launcher's node layout: how many workers share a node, so that hybrid sharding can shard
// within a node (NVLink) and replicate across nodes (the slower network) without the user
// counting GPUs. ddp-run and torchrun say LOCAL_WORLD_SIZE, mpirun OMPI_COMM_WORLD_LOCAL_SIZE,
// srun SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE ("4(x2)"); without a launcher every rank is
// on one node. node_mesh is FSDP2's init_device_mesh((nnodes, nproc_per_node), ("replicate",
// "shard")) read from the environment instead of written by hand.

#include <cstdint>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/process_group.hpp"

namespace ddp::comm {

struct NodeLayout {
  int64_t local_rank = -1;     // this worker's index on its node; -1 where the launcher (or no
                               // launcher) does not say it
  int64_t ranks_per_node = 1;  // workers on each node (every node alike)
};

// This worker's place on its node by the variables of launcher_from_env's launcher, for a job of
// `world_size` ranks. Pure. A malformed or out-of-range variable, nodes of different sizes
// (SLURM_TASKS_PER_NODE "4,2") and a node size that does not divide the world are refused naming
// the variable.
NodeLayout node_layout_from_env(const EnvLookup& env, int64_t world_size);

// Collective over `world`: the number of nodes, after checking that every rank read the same
// node size and that ranks are numbered node by node (rank = node * ranks_per_node + local
// rank, as ddp-run, torchrun, mpirun --map-by node:PE and srun's block distribution number them);
// otherwise refused on every rank naming the first rank out of place.
int64_t node_count(const ProcessGroupPtr& world, const EnvLookup& env = process_env());

// Collective over `world`: the mesh ("replicate", "shard") of node_count(world) replicas of one
// node's ranks each.
DeviceMesh node_mesh(const ProcessGroupPtr& world, const EnvLookup& env = process_env());

}  // namespace ddp::comm
