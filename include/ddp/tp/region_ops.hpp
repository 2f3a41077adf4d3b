#pragma once
// The four collectives of Megatron-style tensor parallelism, as autograd operations over the tp
// group: each is the other's conjugate, so that forward and backward together move each tensor
// once. `x`'s last dim is the one a Linear shards.
//
//   op                  forward                          backward
//   copy_to_region      identity                         all-reduce (sum) of the gradient
//   reduce_from_region  all-reduce (sum)                 identity
//   scatter_last_dim    this rank's slice of the last dim all-gather along the last dim
//   gather_last_dim     all-gather along the last dim    this rank's slice
//
// Without grad mode, or when `x` does not require grad, only the forward runs.

#include <ATen/core/Tensor.h>

#include "ddp/comm/process_group.hpp"

namespace ddp::tp {

at::Tensor copy_to_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);
at::Tensor reduce_from_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);
at::Tensor scatter_last_dim(const at::Tensor& x, const comm::ProcessGroupPtr& group);
at::Tensor gather_last_dim(const at::Tensor& x, const comm::ProcessGroupPtr& group);

// The whole tensor from every rank's piece along `dim` (rank order), collective over `group`;
// every piece has the same shape.
at::Tensor gather_along(const at::Tensor& piece, int64_t dim, const comm::ProcessGroupPtr& group);

}  // namespace ddp::tp
