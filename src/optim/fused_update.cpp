#include "fused_update.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <optional>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::optim {

bool fused_update_applies(const std::vector<at::Tensor>& params,
                          const std::vector<at::Tensor>& grads) {
#if DDP_HAVE_FUSED_OPTIM
  if (params.empty()) return false;
  const at::Tensor& first = params.front();
  if (!first.is_cuda() || !at::isFloatingType(first.scalar_type())) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    for (const at::Tensor* t : {&params[i], &grads[i]}) {
      if (t->device() != first.device() || t->scalar_type() != first.scalar_type() ||
          t->layout() != at::kStrided || !t->is_non_overlapping_and_dense()) {
        return false;
      }
    }
  }
  return true;
#else
  (void)params;
  (void)grads;
  return false;
#endif
}

#if DDP_HAVE_FUSED_OPTIM

namespace {
std::optional<at::Tensor> optional_of(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}
}  // namespace

void fused_sgd(std::vector<at::Tensor>& params, std::vector<at::Tensor>& grads,
               std::vector<at::Tensor>& bufs, double weight_decay, double momentum,
               const at::Tensor& lr, double dampening, bool nesterov, bool first_step,
               const at::Tensor& found_inf) {
  at::_fused_sgd_(params, grads, bufs, weight_decay, momentum, lr, dampening, nesterov,
                  /*maximize=*/false, first_step, /*grad_scale=*/std::nullopt,
                  optional_of(found_inf));
}

void fused_adam(std::vector<at::Tensor>& params, std::vector<at::Tensor>& grads,
                std::vector<at::Tensor>& exp_avgs, std::vector<at::Tensor>& exp_avg_sqs,
                std::vector<at::Tensor>& max_exp_avg_sqs, const at::Tensor& step,
                const at::Tensor& lr, double beta1, double beta2, double weight_decay, double eps,
                bool amsgrad, bool decoupled, const at::Tensor& found_inf) {
  // One count for every parameter: the kernels read state_steps[i] and never write it.
  const std::vector<at::Tensor> steps(params.size(), step);
  if (decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1,
                      beta2, weight_decay, eps, amsgrad, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, optional_of(found_inf));
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
                     weight_decay, eps, amsgrad, /*maximize=*/false,
                     /*grad_scale=*/std::nullopt, optional_of(found_inf));
  }
}

#else

void fused_sgd(std::vector<at::Tensor>&, std::vector<at::Tensor>&, std::vector<at::Tensor>&, double,
               double, const at::Tensor&, double, bool, bool, const at::Tensor&) {
  TORCH_CHECK(false, "ddp: the fused SGD kernel needs torch >= 2.4");
}

void fused_adam(std::vector<at::Tensor>&, std::vector<at::Tensor>&, std::vector<at::Tensor>&,
                std::vector<at::Tensor>&, std::vector<at::Tensor>&, const at::Tensor&,
                const at::Tensor&, double, double, double, double, bool, bool, const at::Tensor&) {
  TORCH_CHECK(false, "ddp: the fused Adam kernel needs torch >= 2.4");
}

#endif

}  // namespace ddp::optim
