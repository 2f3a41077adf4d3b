#pragma once
// Sharding: how a runtime splits a model's tensors AND over which process groups, in one value.
// Layouts alone (layout/tensor_layouts.hpp) are pure and say what each mesh coordinate holds; the
// consumers of a split model (the gradient norm, the export, the tools) also need the groups to
// communicate over, and picked them by style before (a parent group here, a vector per mesh dim
// there, a nullable wrapper pointer elsewhere). Every wrapper answers one (wrap::WrappedModel::
// sharding(), tp::TensorParallel::sharding()), nest() composes them, and a consumer takes it
// without asking which style or mesh made it.
//
//   DDP over group g (n ranks)        mesh {n}      groups {g}      mesh_group g    no names
//   FULLY_SHARD / DEFAULT over g      mesh {n}      groups {g}      mesh_group g    the plan's
//   TP over t                         mesh {m}      groups {t}      mesh_group t    the plan's
//   a style over dp, nested on TP     mesh {n, m}   groups {dp, t}  the mesh's parent (or null)

#include <cstdint>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/layout/tensor_layouts.hpp"

namespace ddp::comm {

struct Sharding {
  // What this rank holds of each parameter (by name) over `layouts.mesh`, at layouts.coordinate.
  layout::TensorLayouts layouts;
  // This rank's group along each mesh dim, in layouts.mesh order (group d's size is mesh[d] and
  // this rank's rank in it is coordinate[d]): what a norm over the shards reduces over, dim by
  // dim. One per dim, never null.
  std::vector<ProcessGroupPtr> groups;
  // The group of the whole mesh: its rank r sits at layout::coordinate_of(r, layouts.mesh). What
  // an export gathers over (one all-gather per tensor, [Note: one all-gather per whole tensor]).
  // For a 1-D mesh groups[0]; for a nested one the mesh's parent, or null when the nesting did
  // not get it (a norm needs only `groups`; an export refuses null, naming the fix).
  ProcessGroupPtr mesh_group;
};

// Nothing split over `group` (DDP, or a bare model's group): mesh {size}, coordinate {rank}, no
// names. A null group: the one-process sharding, mesh {1}, no groups needed.
Sharding whole_over(const ProcessGroupPtr& group);

// `outer`'s runtime splitting again what `inner`'s leaves (layout::nest, name by name): mesh,
// coordinate and groups are outer's followed by inner's; `mesh_group` the group of that whole mesh
// (DeviceMesh::parent(); may be null: see Sharding::mesh_group).
Sharding nest(const Sharding& inner, const Sharding& outer, ProcessGroupPtr mesh_group);

// Checks the invariants above (one group per dim, each of its dim's size at this rank's
// coordinate; the mesh group's size the mesh's product): c10::Error naming `what`, the dim and
// the sizes.
void check_sharding(const Sharding& sharding, const char* what);

}  // namespace ddp::comm
