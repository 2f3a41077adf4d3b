#pragma once
// Which parameters a forward's outputs depend on: a walk of the autograd graph from the outputs'
// grad_fn down to the AccumulateGrad leaves. find_unused_parameters uses it after every forward.

#include <ATen/core/Tensor.h>

#include <vector>

namespace ddp::reducer {

// reachable[i] is true when params[i]'s gradient accumulator is reachable from some output.
std::vector<bool> reachable_params(const std::vector<at::Tensor>& outputs,
                                   const std::vector<at::Tensor>& params);

}  // namespace ddp::reducer
