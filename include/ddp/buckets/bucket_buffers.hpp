#pragma once
// BucketBuffers: where a bucket runtime finds the flat tensor of each bucket it reduces. DDP's
// BucketStorage keeps one per bucket for the whole plan (gradients accumulate straight into them);
// FULLY_SHARD's unit buffers exist only from a unit's last gradient to its reduce-scatter's end
// (gradients/unit_buckets.hpp), so that backward never holds the whole model's gradients at
// once.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace ddp::buckets {

class BucketBuffers {
 public:
  virtual ~BucketBuffers() = default;
  virtual size_t num_buckets() const = 0;
  // Bucket b's whole flat tensor, padding included; what the built-in reduction reduces.
  // Undefined for a sparse bucket, and for a unit bucket outside its reduction.
  virtual const at::Tensor& storage(size_t b) const = 0;
  // Bucket b's gradients as a comm hook sees them (GradBucket::buffer).
  virtual const at::Tensor& data(size_t b) const = 0;
  // Called by the bucket runtime just before bucket b's reduction is launched, on the stream
  // that produced its gradients: the storage must hold them all from here on. Default: nothing
  // (the gradients were written into the storage as they came).
  virtual void fill(size_t /*b*/) {}
  // Called instead of fill(b) where the bucket may be reduced in place ([Note: in-place
  // reduction]): bucket b's gradients, each in its own tensor, when every one of them arrived
  // that way; the buffers then forget them. Empty otherwise (the default): the runtime calls
  // fill(b) and reduces the storage.
  virtual std::vector<at::Tensor> take_whole_staged(size_t /*b*/) { return {}; }
};

}  // namespace ddp::buckets
