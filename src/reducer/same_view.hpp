#pragma once
// Internal to the reducer: whether a gradient still is its bucket slot.

#include <ATen/core/Tensor.h>

namespace ddp::reducer {

// `a` and `b` are the same view of the same memory: same data pointer, shape, strides and dtype.
// A parameter's grad that is not its slot was replaced (zero_grad(set_to_none), the accumulator
// stealing a fresh tensor) and must be copied back into the bucket.
inline bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
}

}  // namespace ddp::reducer
