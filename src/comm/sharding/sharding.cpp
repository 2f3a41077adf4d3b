#include "ddp/comm/sharding/sharding.hpp"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

namespace ddp::comm {

Sharding whole_over(const ProcessGroupPtr& group) {
  Sharding out;
  if (!group) return out;  // mesh {1}: every tensor whole, nothing to communicate
  out.layouts = layout::replicated_over({group->world_size()}, {group->rank()});
  out.groups = {group};
  out.mesh_group = group;
  return out;
}

Sharding nest(const Sharding& inner, const Sharding& outer, ProcessGroupPtr mesh_group) {
  Sharding out;
  out.layouts = layout::nest(inner.layouts, outer.layouts);
  out.groups = outer.groups;
  out.groups.insert(out.groups.end(), inner.groups.begin(), inner.groups.end());
  out.mesh_group = std::move(mesh_group);
  return out;
}

void check_sharding(const Sharding& sharding, const char* what) {
  const layout::TensorLayouts& layouts = sharding.layouts;
  const bool one_process = layouts.mesh == std::vector<int64_t>{1} && sharding.groups.empty();
  if (one_process) return;
  TORCH_CHECK(sharding.groups.size() == layouts.mesh.size(), "ddp: ", what, ": ",
              sharding.groups.size(), " groups for a mesh of ", layouts.mesh.size(),
              " dims: a sharding carries this rank's group along each mesh dim");
  for (size_t d = 0; d < sharding.groups.size(); ++d) {
    const ProcessGroupPtr& group = sharding.groups[d];
    TORCH_CHECK(group, "ddp: ", what, ": mesh dim ", d, " has no group");
    TORCH_CHECK(group->world_size() == layouts.mesh[d] && group->rank() == layouts.coordinate[d],
                "ddp: ", what, ": mesh dim ", d, " has ", layouts.mesh[d],
                " ranks and this rank at ", layouts.coordinate[d], ", but its group has ",
                group->world_size(), " ranks and this rank at ", group->rank());
  }
  if (sharding.mesh_group) {
    TORCH_CHECK(sharding.mesh_group->world_size() == c10::multiply_integers(layouts.mesh),
                "ddp: ", what, ": the mesh group has ", sharding.mesh_group->world_size(),
                " ranks for a mesh of ", c10::multiply_integers(layouts.mesh));
  }
}

}  // namespace ddp::comm
