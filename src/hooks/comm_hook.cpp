#include "ddp/hooks/comm_hook.hpp"

#include <c10/util/Exception.h>

#include <ATen/core/jit_type.h>
#include <c10/util/irange.h>

namespace ddp::hooks {

at::Tensor GradBucket::gradient(size_t i) const {
  TORCH_CHECK(!reduce_scatter, "ddp: GradBucket::gradient: bucket ", index,
              " is a reduce-scattered unit; its parameters' blocks are columns of a (world, S) "
              "layout, not views shaped like them");
  TORCH_CHECK(!cross_replica, "ddp: GradBucket::gradient: bucket ", index,
              " is a unit's gradient shard under hybrid sharding, which holds no parameter's "
              "whole gradient");
  return buffer.narrow(0, offsets.at(i), lengths.at(i)).view(params.at(i).sizes());
}

c10::intrusive_ptr<c10::ivalue::Future> completed_future(const at::Tensor& value) {
  // A future on the value's device: a CPU future refuses CUDA tensors.
  std::vector<c10::Device> devices;
  if (!value.is_cpu()) devices.push_back(value.device());
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get(), devices);
  future->markCompleted(c10::IValue(value));
  return future;
}

}  // namespace ddp::hooks
