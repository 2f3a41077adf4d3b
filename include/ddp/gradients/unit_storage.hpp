#pragma once
// The two typed interfaces between the gradient path of the sharded units (UnitBuckets, under the
// GradientRuntime)
// and the sharded runtime above it (shard/): what the reducer asks of a unit's storage and what it
// tells the runtime. Interfaces instead of callbacks, so that a reader (and a tool) follows each
// call from gradients/ into shard/: FlatParamGroup implements UnitStorage, ShardedModule
// UnitObserver.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

namespace ddp::gradients {

// A unit's parameters as the reducer reads and writes them ([Note: flat shard layout],
// shard/flat_param_group.hpp).
class UnitStorage {
 public:
  virtual ~UnitStorage() = default;
  // Writes every member's gradient into `input` ((world, S) elements of the reduce dtype) and
  // drops the members' full .grad. `member` (or -1) is the member whose gradient is `incoming`,
  // still in its hook (not yet in its .grad); a member without a gradient counts as zeros.
  virtual void fill_reduce_input(const at::Tensor& input, int64_t member,
                                 const at::Tensor& incoming) = 0;
  // After the unit's reduction finished: `shard`, this rank's S elements of the average, becomes
  // (or is added to) the members' sharded gradients.
  virtual void finish_reduce_scatter(const at::Tensor& shard) = 0;
};

// What the sharded runtime hears from the gradient path, on the autograd thread.
class UnitObserver {
 public:
  virtual ~UnitObserver() = default;
  // The first gradient of a backward (synchronized or not).
  virtual void backward_started() = 0;
  // The last gradient of reduce unit `group` arrived (a unit here is one flat parameter group of
  // the sharded runtime, and its index is the group's): nothing later in this backward reads its
  // parameters.
  virtual void unit_done(size_t group) = 0;
};

}  // namespace ddp::gradients
