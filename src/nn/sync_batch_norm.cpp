#include "ddp/nn/sync_batch_norm.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/functional/batchnorm.h>

#include <string>
#include <vector>

#include "channel_kernels.hpp"
#include "ddp/detail/capture_status.hpp"

namespace ddp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels to backward inside the autograd context (saved_data holds IValues).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(comm::ProcessGroupPtr g) : group(std::move(g)) {}
  comm::ProcessGroupPtr group;
};

// y = (x - mean) * invstd * weight + bias with the global batch's mean and invstd; backward
// all-reduces the two per-channel sums the input's gradient needs. `counts`: every rank's local
// count, so that nothing reads the global batch's size on the host.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, const at::Tensor& counts,
                            comm::ProcessGroupPtr group) {
    ctx->save_for_backward({input, weight, mean, invstd, counts});
    ctx->saved_data["group"] =
        c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
    return detail::normalise(input, weight, bias, mean, invstd);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const at::Tensor& counts = saved[4];
    const comm::ProcessGroupPtr group =
        c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())
            ->group;
    // In the input's kernel layout once here: the two kernels below read it as it is.
    const at::Tensor dy = detail::kernel_layout(grad_outputs[0], input);
    const detail::LocalGradSums local = detail::local_grad_sums(dy, input, mean, invstd, weight);
    const int64_t channels = mean.numel();
    at::Tensor sums = at::cat({local.sum_dy, local.sum_dy_xmu});
    group->allreduce_sum(sums, "SyncBatchNorm's backward sums of dy and dy * (x - mean)");
    const at::Tensor grad_input =
        detail::input_grad(dy, input, mean, invstd, weight, sums.narrow(0, 0, channels),
                           sums.narrow(0, channels, channels), counts);
    // The weight's and bias's gradients from this rank's samples: the wrapper averages them.
    return {grad_input,   local.grad_weight, local.grad_bias, at::Tensor(),
            at::Tensor(), at::Tensor(),      at::Tensor()};
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

// Fewer than two values per channel across the group is refused by name on every rank. Only a
// rank with at most one value of its own reads the global count (a host sync); any other knows
// the total exceeds one. A captured step cannot read it and normalises as the kernels do.
void check_enough_values(const at::Tensor& input, int64_t local_count, const at::Tensor& total,
                         const comm::ProcessGroup& group) {
  if (local_count > 1 || ddp::detail::is_capturing(input.device())) return;
  const auto global = static_cast<int64_t>(total.item<double>());
  TORCH_CHECK(global > 1,
              "ddp::nn::SyncBatchNorm: expected more than 1 value per channel when "
              "training, got ",
              global, " across the ", group.world_size(), " ranks of its group (input size ",
              input.sizes(), " on rank ", group.rank(), ")");
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
  // The kernels' layout (channels_last kept, anything else contiguous) made once: the statistics,
  // the normalisation and the saved input for backward all read this one tensor.
  const at::Tensor x = detail::kernel_layout(input, input);
  const int64_t channels = input.size(1);
  const int64_t local_count = channels > 0 ? input.numel() / channels : 0;
  // This rank's count, mean and biased variance per channel (one fp32 pass over the activation),
  // combined in float64: one small gathered tensor of 2C + 1 values a rank.
  at::Tensor all;
  {
    at::NoGradGuard no_grad;
    const detail::LocalStats local = detail::local_stats(x);
    const auto f64 = input.options().dtype(at::kDouble);
    const at::Tensor packed = at::cat({local.mean.to(at::kDouble),
                                       local.var.to(at::kDouble) * static_cast<double>(local_count),
                                       at::full({1}, static_cast<double>(local_count), f64)});
    // Flat: one buffer of world x (2C + 1) values, no per-rank copies (torch's
    // all_gather_into_tensor); the caller's stream waits for it, the host does not.
    const int64_t width = packed.numel(), world = group->world_size();
    all = group->all_gather_async(packed, world * width)
              .wait_on_stream("SyncBatchNorm's forward statistics")
              .view({world, width});
  }
  const at::Tensor counts = all.select(1, 2 * channels);  // [world]
  const at::Tensor total = counts.sum();
  check_enough_values(input, local_count, total, *group);
  // Chan's rule: the global mean, and the sum of squared deviations from it.
  const at::Tensor means = all.narrow(1, 0, channels);       // [world, C]
  const at::Tensor m2s = all.narrow(1, channels, channels);  // [world, C]
  const at::Tensor weights = counts.unsqueeze(1);            // [world, 1]
  const at::Tensor mean = (means * weights).sum(0) / total;
  const at::Tensor var = (m2s + weights * (means - mean).pow(2)).sum(0) / total;  // biased
  const at::Tensor invstd = (var + options.eps()).rsqrt();
  if (options.track_running_stats() && state.running_mean.defined()) {
    at::NoGradGuard no_grad;
    const double factor = running_stats_factor(state);
    const at::Tensor unbiased = var * (total / (total - 1));
    state.running_mean.mul_(1 - factor).add_(mean.to(state.running_mean.scalar_type()), factor);
    state.running_var.mul_(1 - factor).add_(unbiased.to(state.running_var.scalar_type()), factor);
  }
  return SyncBatchNormFunction::apply(x, state.weight, state.bias, mean.to(at::kFloat),
                                      invstd.to(at::kFloat), counts, group);
}

int bind_sync_batch_norms(torch::nn::Module& module, const comm::ProcessGroupPtr& group,
                          bool only_unbound) {
  int bound = 0;
  const auto bind_one = [&](torch::nn::Module& m) {
    if (auto* sync = dynamic_cast<SyncBatchNormGroup*>(&m)) {
      if (only_unbound && (sync->group() || sync->local())) return;
      sync->bind(group);
      ++bound;
    }
  };
  bind_one(module);
  for (const auto& child : module.modules(/*include_self=*/false)) bind_one(*child);
  return bound;
}

}  // namespace ddp::nn
