#pragma once
// The per-channel arithmetic of one rank's part of a batch norm, without communication: this
// rank's statistics, the normalisation by given statistics, the backward's two per-channel sums
// and the input's gradient from the global ones. On a CUDA input ATen's fused kernels (those
// torch.nn.SyncBatchNorm calls: one pass each, a channels_last or bf16 input read as it is, no
// float copy of the activation); elsewhere portable tensor ops in fp32.

#include <ATen/ATen.h>

namespace ddp::nn::detail {

// This rank's per-channel mean and biased variance, fp32 [C] each (zeros for an empty batch).
struct LocalStats {
  at::Tensor mean, var;
};
LocalStats local_stats(const at::Tensor& input);

// (input - mean) * invstd * weight + bias, in the input's dtype and memory format; mean and
// invstd fp32 [C], weight and bias undefined without affine.
at::Tensor normalise(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& mean, const at::Tensor& invstd);

// This rank's per-channel sums of dy and dy * (x - mean), fp32 [C] each, and the weight's and
// bias's gradients from them (undefined without affine).
struct LocalGradSums {
  at::Tensor sum_dy, sum_dy_xmu, grad_weight, grad_bias;
};
LocalGradSums local_grad_sums(const at::Tensor& grad_output, const at::Tensor& input,
                              const at::Tensor& mean, const at::Tensor& invstd,
                              const at::Tensor& weight);

// The input's gradient from the global batch's sums; `counts`: every rank's local count [world]
// (their sum is the global batch).
at::Tensor input_grad(const at::Tensor& grad_output, const at::Tensor& input,
                      const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& weight,
                      const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                      const at::Tensor& counts);

// The input as the kernels read it: channels_last (2d or 3d) kept, anything else contiguous. The
// caller lays the activation and its gradient out once; the functions above check it again
// (a no-op for a tensor already laid out).
at::Tensor kernel_layout(const at::Tensor& t, const at::Tensor& like);

}  // namespace ddp::nn::detail
