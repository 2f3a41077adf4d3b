#include "ddp/optim/foreach_adamw.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "ddp/detail/optimizer_state_key.hpp"

namespace ddp::optim {

torch::Tensor ForeachAdamW::step(LossClosure closure) {
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) {
      return torch::optim::AdamW::step(std::move(closure));
    }
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const double lr = options.lr();
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<at::Scalar> step_sizes, bias_correction2_sqrts;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "ddp: ForeachAdamW does not support sparse gradients");
      auto& slot = state_[detail::optimizer_state_key(p)];
      if (!slot) {  // as AdamW::step creates it
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      s.step(s.step() + 1);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step()));
      step_sizes.emplace_back(-(lr / bias_correction1));
      bias_correction2_sqrts.emplace_back(std::sqrt(bias_correction2));
    }
    if (params.empty()) continue;
    if (options.weight_decay() != 0) at::_foreach_mul_(params, 1 - lr * options.weight_decay());
    at::_foreach_mul_(exp_avgs, beta1);
    at::_foreach_add_(exp_avgs, grads, 1 - beta1);
    at::_foreach_mul_(exp_avg_sqs, beta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
    std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
    at::_foreach_div_(denoms, bias_correction2_sqrts);
    at::_foreach_add_(denoms, options.eps());
    at::_foreach_addcdiv_(params, exp_avgs, denoms, step_sizes);
  }
  return loss;
}

}  // namespace ddp::optim
