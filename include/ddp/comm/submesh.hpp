#pragma once
// A mesh of some of another mesh's dims, as PyTorch's mesh["replicate", "shard"]: the ranks that
// share this rank's coordinates in the other dims, laid out over the kept dims. Over the mesh
// ("replicate", "shard", "tp") of shape {2, 2, 2}, submesh(mesh, {"replicate", "shard"}) is, on
// rank 5 (coordinate {1, 0, 1}), the 2 x 2 mesh of ranks {1, 3, 5, 7} (tp = 1), where rank 5 is at
// {1, 0}: what hybrid sharding runs over beside tensor parallelism on "tp".
//
// The kept dims keep the mesh's order, so a rank's place in the sub-mesh is its coordinates on
// them, row-major, and a layout over the sub-mesh nested on one over the dropped dims
// (layout::nest) is a layout over the whole mesh when the dropped dims are the last ones.

#include <string>
#include <vector>

#include "ddp/comm/device_mesh.hpp"

namespace ddp::comm {

// Collective over mesh.parent(): every rank calls it with the same dims, in the same order among
// its other meshes. `dims` are distinct dims of `mesh` in the mesh's order; anything else is
// refused naming the mesh's dims. The result's sub-groups are its own (new groups, over a new
// parent group of the kept ranks).
DeviceMesh submesh(const DeviceMesh& mesh, const std::vector<std::string>& dims);

}  // namespace ddp::comm
