#pragma once
// TensorLayouts: what a wrapper registers about the tensors it splits, so that whatever reads or
// writes a model's state (export, checkpoints) asks one object instead of each wrapper: every
// parameter name's Layout over one mesh, and this rank's coordinate in it. A name without a layout
// is whole on every coordinate (DDP's parameters, buffers). ShardedModule::layouts() and
// TensorParallel::layouts() answer for their runtimes; FULLY_SHARD over tensor parallelism is
// nest(tp.layouts(), sharded.layouts()), over the mesh {dp, tp}. Pure: no tensors, no groups.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddp/layout/layout.hpp"

namespace ddp::layout {

struct TensorLayouts {
  std::vector<int64_t> mesh{1};        // the mesh every layout below is over
  std::vector<int64_t> coordinate{0};  // this rank's coordinate in it
  // By every name of a parameter (a tied one under each), its layout over `mesh`.
  std::map<std::string, Layout> by_name;

  // `name`'s layout; one not registered is whole on every coordinate of `mesh`, with `shape`.
  Layout of(const std::string& name, const std::vector<int64_t>& shape) const;
};

// `outer`'s runtime splitting again what `inner`'s leaves (layout::nest, name by name): the mesh
// and the coordinate are outer's followed by inner's. A name only inner splits is replicated over
// outer's dims, one only outer splits is whole over inner's.
TensorLayouts nest(const TensorLayouts& inner, const TensorLayouts& outer);

// The layouts of a runtime that splits nothing over `mesh` (DDP over the dp mesh dim): no names,
// so every tensor is whole on every coordinate. nest(tp.layouts(), replicated_over({dp},
// {dp_rank})) describes DDP over tensor parallelism on the mesh {dp, tp}.
TensorLayouts replicated_over(std::vector<int64_t> mesh, std::vector<int64_t> coordinate);

}  // namespace ddp::layout
