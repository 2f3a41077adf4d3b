#include "channel_kernels.hpp"

#include <vector>

namespace ddp::nn::detail {
namespace {

// The per-channel reduction dims of an (N, C, ...) input: all but 1.
std::vector<int64_t> channel_reduce_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel [C] tensor shaped to broadcast against the input: [1, C, 1, ...].
at::Tensor per_channel(const at::Tensor& t, const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = t.numel();
  return t.view(shape);
}

at::Tensor channel_zeros(const at::Tensor& input) {
  return at::zeros({input.size(1)}, input.options().dtype(at::kFloat));
}

}  // namespace

at::Tensor kernel_layout(const at::Tensor& t, const at::Tensor& like) {
  if (like.dim() == 4 && like.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return t.contiguous(at::MemoryFormat::ChannelsLast);
  }
  if (like.dim() == 5 && like.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
    return t.contiguous(at::MemoryFormat::ChannelsLast3d);
  }
  return t.contiguous();
}

LocalStats local_stats(const at::Tensor& input) {
  if (input.numel() == 0) return {channel_zeros(input), channel_zeros(input)};
  if (input.is_cuda()) {
    // eps 0: invstd is 1 / sqrt(var) exactly, and 0 where the variance is 0 (ATen's InvStd).
    const auto [mean, invstd] = at::batch_norm_stats(kernel_layout(input, input), 0.0);
    return {mean, at::where(invstd == 0, at::zeros_like(invstd), invstd.pow(-2))};
  }
  const auto [var, mean] = at::var_mean(input.to(at::kFloat), channel_reduce_dims(input),
                                        /*unbiased=*/false);
  return {mean, var};
}

at::Tensor normalise(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& mean, const at::Tensor& invstd) {
  if (input.numel() == 0) return at::empty_like(input);
  if (input.is_cuda()) {
    return at::batch_norm_elemt(kernel_layout(input, input), weight, bias, mean, invstd, 0.0);
  }
  at::Tensor y = (input.to(at::kFloat) - per_channel(mean, input)) * per_channel(invstd, input);
  if (weight.defined()) y = y * per_channel(weight.to(at::kFloat), input);
  if (bias.defined()) y = y + per_channel(bias.to(at::kFloat), input);
  return y.to(input.scalar_type());
}

LocalGradSums local_grad_sums(const at::Tensor& grad_output, const at::Tensor& input,
                              const at::Tensor& mean, const at::Tensor& invstd,
                              const at::Tensor& weight) {
  const bool affine = weight.defined();
  if (input.numel() == 0) {
    // An empty local batch sums to zeros and still joins the collective.
    LocalGradSums out{channel_zeros(input), channel_zeros(input), {}, {}};
    if (affine) out.grad_weight = out.grad_bias = at::zeros_like(weight);
    return out;
  }
  if (input.is_cuda()) {
    const auto [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = at::batch_norm_backward_reduce(
        kernel_layout(grad_output, input), kernel_layout(input, input), mean, invstd, weight,
        /*input_g=*/true, affine, affine);
    return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
  }
  const auto dims = channel_reduce_dims(input);
  const at::Tensor dy = grad_output.to(at::kFloat);
  const at::Tensor xmu = input.to(at::kFloat) - per_channel(mean, input);
  LocalGradSums out{dy.sum(dims), (dy * xmu).sum(dims), {}, {}};
  if (affine) {
    out.grad_weight = (out.sum_dy_xmu * invstd).to(weight.scalar_type());
    out.grad_bias = out.sum_dy.to(weight.scalar_type());
  }
  return out;
}

at::Tensor input_grad(const at::Tensor& grad_output, const at::Tensor& input,
                      const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& weight,
                      const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                      const at::Tensor& counts) {
  if (input.numel() == 0) return at::empty_like(input);
  if (input.is_cuda()) {
    // The kernel sums the int32 counts itself: no host read of the global batch's size.
    return at::batch_norm_backward_elemt(kernel_layout(grad_output, input),
                                         kernel_layout(input, input), mean, invstd, weight, sum_dy,
                                         sum_dy_xmu, counts.to(at::kInt));
  }
  const at::Tensor total = counts.sum().to(at::kFloat);
  const at::Tensor mean_dy = sum_dy / total;
  const at::Tensor mean_dy_xmu = sum_dy_xmu / total;
  const at::Tensor dy = grad_output.to(at::kFloat);
  const at::Tensor xmu = input.to(at::kFloat) - per_channel(mean, input);
  at::Tensor scale = invstd;
  if (weight.defined()) scale = scale * weight.to(at::kFloat);
  const at::Tensor grad =
      (dy - per_channel(mean_dy, input) - xmu * per_channel(invstd * invstd * mean_dy_xmu, input)) *
      per_channel(scale, input);
  return grad.to(input.scalar_type());
}

}  // namespace ddp::nn::detail
