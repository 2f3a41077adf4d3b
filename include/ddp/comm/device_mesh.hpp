#pragma once
// DeviceMesh: the ranks of a process group laid out as an N-D array with named dims, as
// PyTorch's init_device_mesh: {"dp", "tp"} with shape {2, 2} over 4 ranks puts rank
// r = dp * 2 + tp (row-major: the last dim varies fastest). mesh["tp"] is the sub-group of the
// ranks that share this rank's coordinates in every other dim (here its dp row); collectives on it
// run among those ranks only, independently of the other dims' groups.
//
//   shape {2, 2}, dims {dp, tp}        "tp" groups: {0, 1} {2, 3}
//            tp=0  tp=1               "dp" groups: {0, 2} {1, 3}
//     dp=0    0     1
//     dp=1    2     3
//
// Every sub-group is a real ProcessGroup of the parent's backend (Gloo here, NCCL on GPUs), made
// at construction over the parent's store under its own prefix "<parent>/mesh<id>/<dim>/<index>"
// (<index>: which group of that dim, the other coordinates flattened row-major), so groups never
// share a store key; each is bounded by the parent's timeout.

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::comm {

class DeviceMesh {
 public:
  // Collective over `parent`: every rank of it constructs the same mesh (same shape, same names,
  // in the same order among its other meshes). The product of `shape` must equal
  // parent->world_size(); names are distinct and non-empty.
  DeviceMesh(ProcessGroupPtr parent, std::vector<int64_t> shape,
             std::vector<std::string> dim_names);

  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& dim_names() const { return names_; }
  // Ranks along `dim`; unknown names are an error that lists the mesh's names.
  int64_t size(const std::string& dim) const;
  // Ranks in the mesh (the parent's world size).
  int64_t size() const;
  // This rank's coordinate, one entry per dim.
  const std::vector<int64_t>& coordinate() const { return coordinate_; }
  // The parent-group rank at `coordinate`.
  int rank_at(const std::vector<int64_t>& coordinate) const;
  // This rank's sub-group along `dim`: its rank there is its coordinate in `dim`.
  const ProcessGroupPtr& group(const std::string& dim) const;
  const ProcessGroupPtr& operator[](const std::string& dim) const { return group(dim); }
  const ProcessGroupPtr& parent() const { return parent_; }

 private:
  int dim_index(const std::string& dim) const;
  ProcessGroupPtr parent_;
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
  std::vector<int64_t> coordinate_;      // of this rank; filled at construction
  std::vector<ProcessGroupPtr> groups_;  // this rank's sub-group per dim, by dim index
};

}  // namespace ddp::comm
