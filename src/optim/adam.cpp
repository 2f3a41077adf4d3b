#include "ddp/optim/adam.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>

#include "ddp/detail/optimizer_state_key.hpp"
#include "fused_update.hpp"

namespace ddp::optim {

template <typename Torch, typename Options, typename State>
BasicAdam<Torch, Options, State>::BasicAdam(std::vector<torch::optim::OptimizerParamGroup> groups,
                                            Options defaults)
    : Torch(std::move(groups), defaults),
      DeviceStep(static_cast<torch::optim::Optimizer&>(*this)) {}

template <typename Torch, typename Options, typename State>
BasicAdam<Torch, Options, State>::BasicAdam(std::vector<at::Tensor> params, Options defaults)
    : BasicAdam(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                    std::move(params))},
                defaults) {}

template <typename Torch, typename Options, typename State>
torch::Tensor BasicAdam<Torch, Options, State>::step(typename Torch::LossClosure closure) {
  return step_groups(closure, [this](size_t g) { step_group(g); });
}

template <typename Torch, typename Options, typename State>
void BasicAdam<Torch, Options, State>::step_group(size_t group) {
  constexpr bool kDecoupled = std::is_same_v<Torch, torch::optim::AdamW>;
  const auto& o = static_cast<const Options&>(this->param_groups()[group].options());
  std::vector<at::Tensor> params = stepping(group);
  if (params.empty()) return;
  const auto [beta1, beta2] = o.betas();
  std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  for (const auto& p : params) {
    TORCH_CHECK(!p.grad().is_sparse(), "ddp: Adam does not support sparse gradients");
    auto& slot = this->state_[detail::optimizer_state_key(p)];
    if (!slot) {  // as torch::optim creates it; `step` is written only for checkpoints
      auto fresh = std::make_unique<State>();
      fresh->step(0);
      fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (o.amsgrad()) fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      slot = std::move(fresh);
    }
    auto& s = static_cast<State&>(*slot);
    grads.push_back(p.grad());
    exp_avgs.push_back(s.exp_avg());
    exp_avg_sqs.push_back(s.exp_avg_sq());
    if (o.amsgrad()) max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
  }
  if (fused_update_applies(params, grads)) {
    fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step32(), lr32(group), beta1,
               beta2, o.weight_decay(), o.eps(), o.amsgrad(), kDecoupled, skip_flag());
    return;
  }
  if (host_scalars()) {
    // The CPU: the scalars read on the host (no sync there), and torch::optim's update op for op.
    if (has_skip() && skip_flag().item<double>() > 0) return;
    const double steps = step_count().item<double>();
    const double lr_now = this->param_groups()[group].options().get_lr();
    const double bias_correction1 = 1 - std::pow(beta1, steps);
    const double bias_correction2 = 1 - std::pow(beta2, steps);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& p = params[i];
      at::Tensor grad = grads[i];
      if (o.weight_decay() != 0) {
        if constexpr (kDecoupled) {
          p.mul_(1 - lr_now * o.weight_decay());
        } else {
          grad = grad.add(p, o.weight_decay());
        }
      }
      exp_avgs[i].mul_(beta1).add_(grad, 1 - beta1);
      exp_avg_sqs[i].mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      at::Tensor denom;
      if (o.amsgrad()) {
        at::max_out(max_exp_avg_sqs[i], exp_avg_sqs[i], max_exp_avg_sqs[i]);
        denom = (max_exp_avg_sqs[i].sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
      } else {
        denom = (exp_avg_sqs[i].sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
      }
      p.addcdiv_(exp_avgs[i], denom, -(lr_now / bias_correction1));
    }
    return;
  }
  // Per tensor: torch::optim's terms with device scalars. A skipped step (skip flag set) masks the
  // gradient to 0 and turns every factor into 1 and every added term into 0, so nothing changes.
  const at::Tensor skip = has_skip() ? skipping() : at::Tensor();
  const auto unless_skipped = [&](const at::Tensor& value, double otherwise) {
    return skip.defined() ? at::where(skip, otherwise, value) : value;
  };
  // The count is >= 1 whenever the step is taken; a step skipped before any was taken has 0.
  const at::Tensor steps = step_count().clamp_min(1);
  const at::Tensor bias_correction1 = 1 - at::pow(beta1, steps);
  const at::Tensor bias_correction2_sqrt = (1 - at::pow(beta2, steps)).sqrt();
  const at::Tensor neg_step_size = unless_skipped(-lr(group) / bias_correction1, 0.0);
  const bool decays = o.weight_decay() != 0;
  const at::Tensor decay =
      kDecoupled && decays ? unless_skipped(1 - lr(group) * o.weight_decay(), 1.0) : at::Tensor();
  const at::Tensor beta1_t =
      skip.defined() ? unless_skipped(at::full({}, beta1, steps.options()), 1.0) : at::Tensor();
  const at::Tensor beta2_t =
      skip.defined() ? unless_skipped(at::full({}, beta2, steps.options()), 1.0) : at::Tensor();
  // The step's scalars in the parameters' dtype, made again only when a parameter's differs.
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Tensor step_size_t, inv_bias2_t, decay_t, beta1_typed, beta2_typed;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    at::Tensor grad = grads[i];
    if (p.scalar_type() != dtype) {
      dtype = p.scalar_type();
      step_size_t = neg_step_size.to(dtype);
      // torch divides by a host scalar as a multiplication by its reciprocal, taken in the
      // tensor's dtype (div_true_kernel): the same here, so the rounding is the same.
      inv_bias2_t = 1 / bias_correction2_sqrt.to(dtype);
      if (decay.defined()) decay_t = decay.to(dtype);
      if (skip.defined()) {
        beta1_typed = beta1_t.to(dtype);
        beta2_typed = beta2_t.to(dtype);
      }
    }
    if (decay.defined()) {
      p.mul_(decay_t);  // AdamW: p * (1 - lr * weight_decay), before the moments
    } else if (!kDecoupled && decays) {
      grad = grad.add(p, o.weight_decay());  // Adam: L2 added to the gradient
    }
    at::Tensor& exp_avg = exp_avgs[i];
    at::Tensor& exp_avg_sq = exp_avg_sqs[i];
    if (skip.defined()) {
      grad = at::where(skip, 0.0, grad);
      exp_avg.mul_(beta1_typed).add_(grad, 1 - beta1);
      exp_avg_sq.mul_(beta2_typed).addcmul_(grad, grad, 1 - beta2);
    } else {
      exp_avg.mul_(beta1).add_(grad, 1 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    }
    at::Tensor denom;
    if (o.amsgrad()) {
      at::max_out(max_exp_avg_sqs[i], exp_avg_sq, max_exp_avg_sqs[i]);
      denom = max_exp_avg_sqs[i].sqrt().mul_(inv_bias2_t).add_(o.eps());
    } else {
      denom = exp_avg_sq.sqrt().mul_(inv_bias2_t).add_(o.eps());
    }
    // p - lr / (1 - beta1^t) * (m / denom), as torch::optim's addcdiv_(m, denom, -step_size):
    // the quotient in place into denom, then one multiply-add by the device scalar. The rounding
    // may differ from torch's in the last bit (tests/optim bound it).
    at::div_out(denom, exp_avg, denom);
    p.addcmul_(denom, step_size_t);
  }
}

template <typename Torch, typename Options, typename State>
void BasicAdam<Torch, Options, State>::steps_to_state() {
  const int64_t taken = steps_taken();
  for (auto& entry : this->state_) static_cast<State&>(*entry.second).step(taken);
}

template <typename Torch, typename Options, typename State>
void BasicAdam<Torch, Options, State>::steps_from_state() {
  std::optional<int64_t> taken;
  for (auto& entry : this->state_) {
    const int64_t s = static_cast<State&>(*entry.second).step();
    TORCH_CHECK(!taken || *taken == s, "ddp: Adam: the loaded state counts ", *taken,
                " steps for one parameter and ", s,
                " for another; this Adam keeps one step count for all parameters");
    taken = s;
  }
  set_steps_taken(taken.value_or(0));
}

template class BasicAdam<torch::optim::Adam, torch::optim::AdamOptions,
                         torch::optim::AdamParamState>;
template class BasicAdam<torch::optim::AdamW, torch::optim::AdamWOptions,
                         torch::optim::AdamWParamState>;

}  // namespace ddp::optim
