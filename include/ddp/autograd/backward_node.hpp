#pragma once
// The one way libddp puts a node of its own into an autograd graph: `value` (computed from `input`
// without autograd, or a detached alias of it) becomes an output whose gradient is `backward`
// applied to the gradient arriving at it, passed on to `input`'s history. Used by the module
// boundaries (on_backward, below) and by tensor parallelism's region collectives
// (tp/region_ops.hpp); both are "one gradient in, one gradient out".
//
// `backward` runs on the autograd thread once the gradient of `value` is complete (every use
// summed), before anything upstream of it; it receives an undefined tensor when no gradient
// flows (an unused output) and may return one.

#include <ATen/core/Tensor.h>

#include <functional>

namespace ddp::autograd {

using BackwardFn = std::function<at::Tensor(const at::Tensor&)>;

// `value` with the node as its history. Without grad mode, or when `input` does not require grad,
// `value` unchanged and `backward` never runs. `name` is what the node reports (graph dumps).
at::Tensor attach_backward(at::Tensor value, const at::Tensor& input, BackwardFn backward,
                           const char* name);

// `output` unchanged in value, with a node whose backward runs `fn` once the gradient of `output`
// has arrived and before it flows further back (the gradient itself passes through unchanged).
at::Tensor on_backward(const at::Tensor& output, std::function<void()> fn);

}  // namespace ddp::autograd
