#pragma once
// Comm hooks: how a full bucket's gradients are reduced. One interface: the gradient runtime
// (gradients/gradient_runtime.hpp) hands a GradBucket to the hook when the bucket is full (in
// bucket order, on every rank) and waits on the returned future at the end of backward. The default
// is allreduce (average over the world). PyTorch's register_comm_hook, natively.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp::hooks {

// What a hook sees of one bucket.
struct GradBucket {
  size_t index = 0;   // bucket index; bucket 0 is reduced first
  at::Tensor buffer;  // flat gradients of the bucket's parameters: the local sum, not averaged
  std::vector<at::Tensor> params;  // the parameters, in buffer order
  std::vector<int64_t> offsets;    // element offset of each parameter's gradient in `buffer`
  std::vector<int64_t> lengths;    // element count of each
  bool is_last = false;            // the last bucket of this backward
  int64_t iteration = 0;           // synchronized backwards completed before this one
  // Which bucket plan this bucket belongs to: 0 for the first, +1 each time the plan changes
  // (graph planning at the first forward, or the rebuild after iteration 1). A hook that keeps
  // state per bucket index must re-key it when the epoch changes: the same index may now hold
  // other parameters at other offsets.
  int64_t plan_epoch = 0;
  // FULLY_SHARD: the bucket is one unit, `buffer` its (world, S) layout row-major (row r: what
  // rank r will hold; parameter i's block is columns [offsets[i], offsets[i] + lengths[i]) of
  // every row), and the hook returns this rank's row of the average (S elements), a
  // reduce-scatter. `rank` and `world` are the group's then.
  bool reduce_scatter = false;
  // Hybrid sharding ([Note: hybrid sharding], gradients/unit_buckets.hpp): `buffer` is this rank's
  // averaged shard of one unit, to be averaged across the replicate group (whose `rank` and
  // `world` these are then) and returned whole (same numel); it holds no parameter's whole
  // gradient, so gradient(i) refuses and per-parameter hooks (PowerSGD) refuse it.
  bool cross_replica = false;
  int rank = 0;
  int world = 1;
  // The gradient of parameter i as a tensor shaped like it: a view into `buffer` (all-reduced
  // buckets only).
  at::Tensor gradient(size_t i) const;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  // Starts the reduction of `bucket.buffer` and returns a future whose value is a Tensor holding
  // the reduced flat gradients (same numel and dtype as the buffer; it may be the buffer itself),
  // or with bucket.reduce_scatter this rank's row of the average (numel / world elements).
  // The hook must issue its collectives in call order: every rank calls it for the same buckets in
  // the same order. It may write into bucket.buffer.
  virtual c10::intrusive_ptr<c10::ivalue::Future> run(GradBucket& bucket) = 0;
  // For stats and errors, e.g. "allreduce", "fp16_compress", "powersgd".
  virtual std::string name() const = 0;
};

using CommHookPtr = std::shared_ptr<CommHook>;

// A future already holding `value`: for hooks that finish their work inside run().
c10::intrusive_ptr<c10::ivalue::Future> completed_future(const at::Tensor& value);

}  // namespace ddp::hooks
