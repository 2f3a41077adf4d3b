#include "ddp/comm/device_mesh.hpp"

#include <c10/util/Exception.h>

#include <set>

#include "ddp/detail/join.hpp"

namespace ddp::comm {

using detail::join;

DeviceMesh::DeviceMesh(ProcessGroupPtr parent, std::vector<int64_t> shape,
                       std::vector<std::string> dim_names)
    : parent_(std::move(parent)), shape_(std::move(shape)), names_(std::move(dim_names)) {
  TORCH_CHECK(parent_, "ddp: DeviceMesh needs a process group");
  TORCH_CHECK(!shape_.empty() && shape_.size() == names_.size(), "ddp: DeviceMesh shape [",
              join(shape_), "] has ", shape_.size(), " dims but ", names_.size(),
              " dim names were given [", join(names_), "]");
  std::set<std::string> seen;
  int64_t product = 1;
  for (size_t d = 0; d < shape_.size(); ++d) {
    TORCH_CHECK(shape_[d] >= 1, "ddp: DeviceMesh dim '", names_[d], "' has size ", shape_[d],
                ": every dim needs at least 1 rank");
    TORCH_CHECK(!names_[d].empty() && names_[d].find('/') == std::string::npos &&
                    seen.insert(names_[d]).second,
                "ddp: DeviceMesh dim names must be distinct, non-empty and without '/': got [",
                join(names_), "]");
    product *= shape_[d];
  }
  TORCH_CHECK(product == parent_->world_size(), "ddp: DeviceMesh shape [", join(shape_), "] holds ",
              product, " ranks, but the process group has ", parent_->world_size(),
              ": the product of the shape must equal the world size");
  // Row-major coordinate of this rank: the last dim varies fastest.
  coordinate_.assign(shape_.size(), 0);
  int64_t rest = parent_->rank();
  for (size_t d = shape_.size(); d-- > 0;) {
    coordinate_[d] = rest % shape_[d];
    rest /= shape_[d];
  }
  // One id per mesh, the same on every rank (meshes are built collectively, in the same order):
  // two meshes over one parent never share a prefix.
  const std::string mesh = "mesh" + std::to_string(parent_->next_exchange_id());
  // Groups are made dim by dim in the same order on every rank: a rank connecting its dim-d
  // group only waits for peers that are connecting that same group.
  for (size_t d = 0; d < shape_.size(); ++d) {
    std::vector<int> members;
    std::vector<int64_t> at = coordinate_;
    for (int64_t i = 0; i < shape_[d]; ++i) {
      at[d] = i;
      members.push_back(rank_at(at));
    }
    // Which group of this dim: the other coordinates, flattened row-major.
    int64_t index = 0;
    for (size_t e = 0; e < shape_.size(); ++e) {
      if (e != d) index = index * shape_[e] + coordinate_[e];
    }
    groups_.push_back(
        parent_->new_group(members, mesh + "/" + names_[d] + "/" + std::to_string(index)));
  }
}

int DeviceMesh::dim_index(const std::string& dim) const {
  for (size_t d = 0; d < names_.size(); ++d) {
    if (names_[d] == dim) return static_cast<int>(d);
  }
  TORCH_CHECK(false, "ddp: DeviceMesh has no dim '", dim, "'; its dims are [", join(names_), "]");
}

int64_t DeviceMesh::size(const std::string& dim) const {
  return shape_[static_cast<size_t>(dim_index(dim))];
}

int64_t DeviceMesh::size() const { return parent_->world_size(); }

int DeviceMesh::rank_at(const std::vector<int64_t>& coordinate) const {
  TORCH_CHECK(coordinate.size() == shape_.size(), "ddp: DeviceMesh coordinate [", join(coordinate),
              "] has ", coordinate.size(), " entries; the mesh has ", shape_.size(), " dims");
  int64_t rank = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    TORCH_CHECK(coordinate[d] >= 0 && coordinate[d] < shape_[d], "ddp: DeviceMesh coordinate [",
                join(coordinate), "] is outside shape [", join(shape_), "]");
    rank = rank * shape_[d] + coordinate[d];
  }
  return static_cast<int>(rank);
}

const ProcessGroupPtr& DeviceMesh::group(const std::string& dim) const {
  return groups_[static_cast<size_t>(dim_index(dim))];
}

}  // namespace ddp::comm
