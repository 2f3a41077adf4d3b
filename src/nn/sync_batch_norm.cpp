#include "ddp/nn/sync_batch_norm.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/functional/batchnorm.h>

#include <string>
#include <vector>

namespace ddp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

// The group travels to backward inside the autograd context (saved_data holds IValues).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(comm::ProcessGroupPtr g) : group(std::move(g)) {}
  comm::ProcessGroupPtr group;
};

// y = (x - mean) * invstd * weight + bias with the global batch's mean and invstd; backward
// all-reduces the two per-channel sums the input's gradient needs.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, int64_t count, comm::ProcessGroupPtr group) {
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] =
        c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
    at::Tensor y = (input.to(at::kFloat) - per_channel(mean, input)) * per_channel(invstd, input);
    if (weight.defined()) y = y * per_channel(weight.to(at::kFloat), input);
    if (bias.defined()) y = y + per_channel(bias.to(at::kFloat), input);
    return y.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const auto count = static_cast<double>(ctx->saved_data["count"].toInt());
    const comm::ProcessGroupPtr group =
        c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())
            ->group;
    const at::Tensor dy = grad_outputs[0].to(at::kFloat);
    const at::Tensor xmu = input.to(at::kFloat) - per_channel(mean, input);
    const auto dims = channel_reduce_dims(input);
    const int64_t channels = mean.numel();
    // An empty local batch sums to zeros and still joins the collective.
    at::Tensor sums = at::cat({dy.sum(dims), (dy * xmu).sum(dims)});
    const at::Tensor local = sums.clone();  // this rank's, for the weight's and bias's gradients
    group->allreduce_sum(sums, "SyncBatchNorm's backward sums of dy and dy * (x - mean)");
    const at::Tensor mean_dy = sums.narrow(0, 0, channels) / count;
    const at::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / count;
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(at::kFloat);
    const at::Tensor grad_input = (dy - per_channel(mean_dy, input) -
                                   xmu * per_channel(invstd * invstd * mean_dy_xmu, input)) *
                                  per_channel(scale, input);
    at::Tensor grad_weight, grad_bias;
    if (weight.defined()) {
      grad_weight = (local.narrow(0, channels, channels) * invstd).to(weight.scalar_type());
      grad_bias = local.narrow(0, 0, channels).to(weight.scalar_type());
    }
    return {grad_input.to(input.scalar_type()),
            grad_weight,
            grad_bias,
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// A training forward's step of the running statistics, as torch's BatchNormImplBase::forward
// takes it: num_batches_tracked counts the batch, and the factor is the momentum, or 1 / that
// count without one (a cumulative average).
double running_stats_factor(const BatchNormState& s) {
  const auto& options = *s.options;
  double factor = options.momentum().value_or(0.0);
  if (s.training && options.track_running_stats() && s.num_batches_tracked.defined()) {
    at::NoGradGuard no_grad;
    s.num_batches_tracked.add_(1);
    if (!options.momentum()) factor = 1.0 / s.num_batches_tracked.item<double>();
  }
  return factor;
}

// torch's BatchNorm forward: what an unbound SyncBatchNorm, one of a group of one rank, and
// evaluation run.
at::Tensor plain_batch_norm(const at::Tensor& input, const BatchNormState& s) {
  return torch::nn::functional::detail::batch_norm(
      input, s.running_mean, s.running_var, s.weight, s.bias,
      s.training || !s.options->track_running_stats(), running_stats_factor(s), s.options->eps());
}

}  // namespace

at::Tensor sync_batch_norm(const at::Tensor& input, const BatchNormState& state,
                           const comm::ProcessGroupPtr& group) {
  TORCH_CHECK(state.options != nullptr, "ddp::nn::sync_batch_norm needs the module's options");
  // As PyTorch's SyncBatchNorm: only a training forward synchronises; evaluation without running
  // statistics normalises by the local batch.
  if (!state.training || !group || group->world_size() == 1) {
    return plain_batch_norm(input, state);
  }
  const auto& options = *state.options;
  const int64_t channels = input.size(1);
  const int64_t local_count = channels > 0 ? input.numel() / channels : 0;
  const auto dims = channel_reduce_dims(input);
  // This rank's count, mean and sum of squared deviations per channel (one pass in fp32 over the
  // activation, as torch's batch_norm_stats; no float64 copy of it), combined in float64: one
  // small gathered tensor of 2C + 1 values a rank.
  const auto f64 = input.options().dtype(at::kDouble);
  at::Tensor local_mean = at::zeros({channels}, f64), local_m2 = at::zeros({channels}, f64);
  if (local_count > 0) {
    at::NoGradGuard no_grad;
    const auto [var, mean] = at::var_mean(input.to(at::kFloat), dims, /*unbiased=*/false);
    local_mean = mean.to(at::kDouble);
    local_m2 = var.to(at::kDouble) * static_cast<double>(local_count);
  }
  const at::Tensor packed =
      at::cat({local_mean, local_m2, at::full({1}, static_cast<double>(local_count), f64)});
  const at::Tensor all =
      at::stack(group->all_gather_each(packed, "SyncBatchNorm's forward statistics"));
  const at::Tensor counts = all.select(1, 2 * channels);  // [world]
  const auto total = static_cast<int64_t>(counts.sum().item<double>());
  TORCH_CHECK(total > 1,
              "ddp::nn::SyncBatchNorm: expected more than 1 value per channel when "
              "training, got ",
              total, " across the ", group->world_size(), " ranks of its group (input size ",
              input.sizes(), " on rank ", group->rank(), ")");
  // Chan's rule: the global mean, and the sum of squared deviations from it.
  const at::Tensor means = all.narrow(1, 0, channels);       // [world, C]
  const at::Tensor m2s = all.narrow(1, channels, channels);  // [world, C]
  const at::Tensor weights = counts.unsqueeze(1);            // [world, 1]
  const at::Tensor mean = (means * weights).sum(0) / static_cast<double>(total);
  const at::Tensor m2 = (m2s + weights * (means - mean).pow(2)).sum(0);
  const at::Tensor var = m2 / static_cast<double>(total);  // biased: the normaliser's
  const at::Tensor invstd = (var + options.eps()).rsqrt();
  if (options.track_running_stats() && state.running_mean.defined()) {
    at::NoGradGuard no_grad;
    const double factor = running_stats_factor(state);
    const at::Tensor unbiased = var * (static_cast<double>(total) / static_cast<double>(total - 1));
    state.running_mean.mul_(1 - factor).add_(mean.to(state.running_mean.scalar_type()), factor);
    state.running_var.mul_(1 - factor).add_(unbiased.to(state.running_var.scalar_type()), factor);
  }
  return SyncBatchNormFunction::apply(input, state.weight, state.bias, mean.to(at::kFloat),
                                      invstd.to(at::kFloat), total, group);
}

int bind_sync_batch_norms(torch::nn::Module& module, const comm::ProcessGroupPtr& group,
                          bool only_unbound) {
  int bound = 0;
  const auto bind_one = [&](torch::nn::Module& m) {
    if (auto* sync = dynamic_cast<SyncBatchNormGroup*>(&m)) {
      if (only_unbound && sync->group()) return;
      sync->bind(group);
      ++bound;
    }
  };
  bind_one(module);
  for (const auto& child : module.modules(/*include_self=*/false)) bind_one(*child);
  return bound;
}

}  // namespace ddp::nn
