#pragma once
// The zoo's Linear call, for the GPT and Llama alike. ATen's linear, which Python's nn.Linear
// calls: a contiguous [B, T, d] input becomes one addmm with the bias fused in. The C++ frontend's
// Linear::forward runs matmul and then adds the bias, one more kernel and pass over the output
// (measured on an H200: gpt2-medium 4.5% slower per step than the same model in Python), and
// rounds differently from the Python model (7e-7 on CPU).
//
// Through unit::run_unit, so that tensor parallelism can split it (tp/parallelize.hpp); a plain
// call without a tensor-parallel plan.

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "ddp/unit/activation_checkpoint.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp::models {

inline torch::Tensor unit_linear(const torch::nn::Linear& m, const torch::Tensor& x) {
  return unit::run_unit(
      *m, [&m](const torch::Tensor& in) { return at::linear(in, m->weight, m->bias); }, x);
}

// unit_linear for a block's last projection, whose output is only added to the residual stream
// (nothing between it and the block's output reads its value): not computed in a checkpoint's
// recompute, only its gradients (unit::output_linear, [Note: the recompute's last projection]).
inline torch::Tensor output_unit_linear(const torch::nn::Linear& m, const torch::Tensor& x) {
  return unit::run_unit(
      *m, [&m](const torch::Tensor& in) { return unit::output_linear(in, m->weight, m->bias); }, x);
}

}  // namespace ddp::models
