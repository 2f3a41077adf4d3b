#include "ddp/optim/capturable.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <set>
#include <utility>

namespace ddp::optim {
namespace {

// 0-dim float64 on `like`'s device: the scalars a captured step reads.
at::Tensor device_scalar(double value, const at::Tensor& like) {
  return at::full({}, value, like.options().dtype(at::kDouble));
}

}  // namespace

CapturableOptimizer::CapturableOptimizer(std::vector<at::Tensor> params, double lr) {
  TORCH_CHECK(!params.empty(), "ddp: a capturable optimizer needs at least one parameter");
  TORCH_CHECK(params[0].defined(), "ddp: a capturable optimizer got an undefined parameter");
  const c10::Device device = params[0].device();
  std::set<const c10::TensorImpl*> seen;
  for (at::Tensor& p : params) {
    TORCH_CHECK(p.defined(), "ddp: a capturable optimizer got an undefined parameter");
    TORCH_CHECK(p.device() == device, "ddp: a capturable optimizer's parameters are on ", device,
                " and ", p.device(), "; it keeps its scalars on one device");
    // Tied weights are one parameter: stepping them twice would be a silently wrong update.
    if (seen.insert(p.unsafeGetTensorImpl()).second) params_.push_back(std::move(p));
  }
  lr_ = device_scalar(lr, params_[0]);
  step_ = device_scalar(0, params_[0]);
}

void CapturableOptimizer::zero_grad(bool set_to_none) {
  for (at::Tensor& p : params_) {
    at::Tensor& g = p.mutable_grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      g.reset();
    } else {
      g.zero_();
    }
  }
}

at::Tensor CapturableOptimizer::typed(const at::Tensor& scalar, size_t i) const {
  return scalar.to(params_[i].scalar_type());  // no copy when the dtype is already the same
}

void CapturableOptimizer::set_lr(double lr) { lr_.fill_(lr); }

CapturableSgd::CapturableSgd(std::vector<at::Tensor> params, CapturableSgdOptions options)
    : CapturableOptimizer(std::move(params), options.lr), options_(options) {
  TORCH_CHECK(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
              "ddp: CapturableSgd: Nesterov momentum needs momentum > 0 and dampening 0");
  momentum_.resize(params_.size());
}

void CapturableSgd::step() {
  at::NoGradGuard no_grad;
  step_.add_(1);
  const at::Tensor neg_lr = lr_.neg();
  at::Tensor neg_lr_typed;  // in the dtype of the parameter that made it: reused while it matches
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    at::Tensor d_p = grad;
    if (options_.weight_decay != 0) d_p = d_p.add(p, options_.weight_decay);
    if (options_.momentum != 0) {
      at::Tensor& buf = momentum_[i];
      if (!buf.defined()) {
        buf = d_p.clone().detach();  // the first step's buffer is its gradient, as torch::optim
      } else {
        buf.mul_(options_.momentum).add_(d_p, 1 - options_.dampening);
      }
      d_p = options_.nesterov ? d_p.add(buf, options_.momentum) : buf;
    }
    if (!neg_lr_typed.defined() || neg_lr_typed.scalar_type() != p.scalar_type()) {
      neg_lr_typed = typed(neg_lr, i);
    }
    p.addcmul_(d_p, neg_lr_typed);  // p - lr * d_p in one kernel, lr read on the device
  }
}

CapturableAdam::CapturableAdam(std::vector<at::Tensor> params, CapturableAdamOptions options)
    : CapturableOptimizer(std::move(params), options.lr), options_(options) {
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  max_exp_avg_sq_.resize(params_.size());
}

void CapturableAdam::step() {
  at::NoGradGuard no_grad;
  const bool first = stepping_.empty();
  if (first) {
    for (const at::Tensor& p : params_) stepping_.push_back(p.grad().defined());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(params_[i].grad().defined() == stepping_[i], "ddp: CapturableAdam: parameter ", i,
                " (shape ", params_[i].sizes(), ") ",
                stepping_[i] ? "has no gradient in this step but had one in the first"
                             : "has a gradient in this step but had none in the first",
                "; the capturable Adam keeps one step count for all parameters, so each must get "
                "a gradient in every step or in none");
  }
  const auto [beta1, beta2] = options_.betas;
  step_.add_(1);
  // The bias corrections and the step size, on the device: 1 - beta^t, lr / (1 - beta1^t).
  const at::Tensor bias_correction1 = 1 - at::pow(beta1, step_);
  const at::Tensor bias_correction2_sqrt = (1 - at::pow(beta2, step_)).sqrt();
  const at::Tensor neg_step_size = -lr_ / bias_correction1;
  const at::Tensor decay = options_.decoupled_weight_decay && options_.weight_decay != 0
                               ? 1 - lr_ * options_.weight_decay
                               : at::Tensor();
  // The step's scalars in the parameters' dtype, made again only when a parameter's differs.
  at::ScalarType scalars_dtype = at::ScalarType::Undefined;
  at::Tensor step_size_t, inv_bias2_t, decay_t;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!stepping_[i]) continue;
    at::Tensor& p = params_[i];
    at::Tensor grad = p.grad();
    TORCH_CHECK(!grad.is_sparse(), "ddp: CapturableAdam does not support sparse gradients");
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
      exp_avg_sq_[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
      if (options_.amsgrad) max_exp_avg_sq_[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    if (p.scalar_type() != scalars_dtype) {
      scalars_dtype = p.scalar_type();
      step_size_t = typed(neg_step_size, i);
      // torch divides by a host scalar as a multiplication by its reciprocal, taken in the
      // tensor's dtype (div_true_kernel): the same here, so the rounding is the same.
      inv_bias2_t = 1 / typed(bias_correction2_sqrt, i);
      if (decay.defined()) decay_t = typed(decay, i);
    }
    if (decay.defined()) {
      p.mul_(decay_t);  // AdamW: p * (1 - lr * weight_decay), before the moments
    } else if (options_.weight_decay != 0) {
      grad = grad.add(p, options_.weight_decay);  // Adam: L2 added to the gradient
    }
    at::Tensor& exp_avg = exp_avg_[i];
    at::Tensor& exp_avg_sq = exp_avg_sq_[i];
    exp_avg.mul_(beta1).add_(grad, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    at::Tensor denom;
    if (options_.amsgrad) {
      at::max_out(max_exp_avg_sq_[i], exp_avg_sq, max_exp_avg_sq_[i]);
      denom = max_exp_avg_sq_[i].sqrt().mul_(inv_bias2_t).add_(options_.eps);
    } else {
      denom = exp_avg_sq.sqrt().mul_(inv_bias2_t).add_(options_.eps);
    }
    // p - lr / (1 - beta1^t) * (m / denom), as torch::optim's addcdiv_(m, denom, -step_size):
    // the quotient in place into denom, then one multiply-add by the device scalar. The rounding
    // may differ from torch's in the last bit (tests/optim bound it).
    at::div_out(denom, exp_avg, denom);
    p.addcmul_(denom, step_size_t);
  }
}

}  // namespace ddp::optim
