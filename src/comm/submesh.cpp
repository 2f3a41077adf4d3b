#include "ddp/comm/submesh.hpp"

#include <c10/util/Exception.h>

#include "ddp/detail/join.hpp"

namespace ddp::comm {

using detail::join;

DeviceMesh submesh(const DeviceMesh& mesh, const std::vector<std::string>& dims) {
  const std::vector<std::string>& names = mesh.dim_names();
  TORCH_CHECK(!dims.empty(), "ddp: submesh needs at least one dim of [", join(names), "]");
  // Which mesh dims are kept, in the mesh's order: dims must be a subsequence of names.
  std::vector<bool> kept(names.size(), false);
  std::vector<int64_t> shape;
  size_t next = 0;
  for (const std::string& dim : dims) {
    while (next < names.size() && names[next] != dim) ++next;
    TORCH_CHECK(next < names.size(), "ddp: submesh of dims [", join(dims),
                "]: each must be a distinct dim of the mesh, in its order [", join(names), "]");
    kept[next] = true;
    shape.push_back(mesh.shape()[next]);
    ++next;
  }
  // The members: every coordinate that agrees with this rank's on the dropped dims, row-major
  // over the kept ones (the last kept dim fastest).
  std::vector<int> members;
  std::vector<int64_t> at = mesh.coordinate();
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i;
    for (size_t d = names.size(); d-- > 0;) {
      if (!kept[d]) continue;
      at[d] = rest % mesh.shape()[d];
      rest /= mesh.shape()[d];
    }
    members.push_back(mesh.rank_at(at));
  }
  // Which group: the dropped coordinates, flattened row-major; one id per call, the same on
  // every rank, so two submeshes of one parent never share a store prefix.
  int64_t index = 0;
  for (size_t d = 0; d < names.size(); ++d) {
    if (!kept[d]) index = index * mesh.shape()[d] + mesh.coordinate()[d];
  }
  const ProcessGroupPtr& parent = mesh.parent();
  const std::string name =
      "submesh" + std::to_string(parent->next_exchange_id()) + "/" + std::to_string(index);
  return DeviceMesh(parent->new_group(members, name), std::move(shape), dims);
}

}  // namespace ddp::comm
