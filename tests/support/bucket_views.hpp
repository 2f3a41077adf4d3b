#pragma once
// Where a DDP model's gradient lives after backward: inside its bucket's flat storage (a bucket
// view) or in a tensor of its own (reduce_in_place).

#include <cstddef>

#include "ddp/gradients/gradient_runtime.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"

namespace ddp::testing {

// Whether parameter p's gradient (float) lies wholly inside its bucket's storage; false while
// the bucket's storage was never allocated.
template <typename Model>
bool grad_in_its_bucket(Model& model, size_t p) {
  const auto& grad = model.parameters()[p].grad();
  const auto& buffer =
      parallel::detail::gradients_of(model).bucket_buffer(model.bucket_plan().bucket_of[p]);
  if (!buffer.defined()) return false;
  const auto* begin = buffer.template data_ptr<float>();
  const auto* at = grad.template data_ptr<float>();
  return at >= begin && at + grad.numel() <= begin + buffer.numel();
}

}  // namespace ddp::testing
