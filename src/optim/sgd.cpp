#include "ddp/optim/sgd.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

#include "ddp/detail/optimizer_state_key.hpp"
#include "ddp/detail/torch_compat.hpp"
#include "fused_update.hpp"

namespace ddp::optim {
Sgd::Sgd(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions defaults)
    // torch::optim::SGD refuses Nesterov without momentum or with dampening, by its own text.
    : torch::optim::SGD(std::move(groups), defaults),
      DeviceStep(static_cast<torch::optim::Optimizer&>(*this)) {}

Sgd::Sgd(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults)
    : Sgd(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
              std::move(params))},
          defaults) {}

torch::Tensor Sgd::step(LossClosure closure) {
  return step_groups(closure, [this](size_t g) { step_group(g); });
}

void Sgd::step_group(size_t group) {
  const auto& o = static_cast<const torch::optim::SGDOptions&>(param_groups()[group].options());
  std::vector<at::Tensor> params = stepping(group);
  if (params.empty()) return;
  const double momentum = o.momentum();
  // The momentum buffers, made by the first step (zeros: a fused or skipped first step writes
  // them, see the header).
  std::vector<at::Tensor> bufs;
  bool first = false;
  if (momentum != 0) {
    for (const auto& p : params) {
      auto& slot = state_[detail::optimizer_state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::SGDParamState>();
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::SGDParamState&>(*slot);
      if (!s.momentum_buffer().defined()) {
        first = true;
        s.momentum_buffer(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      bufs.push_back(s.momentum_buffer());
    }
  }
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    TORCH_CHECK(!p.grad().is_sparse(), "ddp: Sgd does not support sparse gradients");
    grads.push_back(p.grad());
  }
  if (fused_update_applies(params, grads)) {
    fused_sgd(params, grads, bufs, o.weight_decay(), momentum, lr32(group), o.dampening(),
              o.nesterov(), first, skip_flag());
    return;
  }
  if (host_scalars()) {
    // The CPU: the scalars read on the host (no sync there), and torch::optim's update op for op.
    if (has_skip() && skip_flag().item<double>() > 0) return;
    const double lr_now = param_groups()[group].options().get_lr();
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor d_p = grads[i];
      if (o.weight_decay() != 0) d_p = d_p.add(params[i], o.weight_decay());
      if (momentum != 0) {
        if (first) {
          bufs[i].copy_(d_p);  // the first step's buffer is its gradient, as torch::optim
        } else {
          bufs[i].mul_(momentum).add_(d_p, 1 - o.dampening());
        }
        d_p = o.nesterov() ? d_p.add(bufs[i], momentum) : bufs[i];
      }
      params[i].add_(d_p, -1 * lr_now);
    }
    return;
  }
  const at::Tensor skip = has_skip() ? skipping() : at::Tensor();
  const at::Tensor neg_lr = has_skip() ? at::where(skip, 0.0, -lr(group)) : -lr(group);
  at::Tensor neg_lr_typed;  // in the dtype of the parameter that made it: reused while it matches
  at::Tensor momentum_typed;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    at::Tensor d_p = grads[i];
    if (o.weight_decay() != 0) d_p = d_p.add(p, o.weight_decay());
    if (skip.defined()) d_p = at::where(skip, 0.0, d_p);  // a skipped step adds nothing
    if (momentum != 0) {
      at::Tensor& buf = bufs[i];
      if (first && !skip.defined()) {
        buf.copy_(d_p);  // the first step's buffer is its gradient, as torch::optim
      } else if (skip.defined()) {
        // Skipped: momentum 1 and a zero gradient leave the buffer as it was.
        if (!momentum_typed.defined() || momentum_typed.scalar_type() != buf.scalar_type()) {
          momentum_typed =
              at::where(skip, 1.0, at::full({}, momentum, skip.options().dtype(buf.scalar_type())))
                  .to(buf.scalar_type());
        }
        if (first) {
          buf.add_(d_p);  // the first gradient (zero when skipped)
        } else {
          buf.mul_(momentum_typed).add_(d_p, 1 - o.dampening());
        }
      } else {
        buf.mul_(momentum).add_(d_p, 1 - o.dampening());
      }
      d_p = o.nesterov() ? d_p.add(buf, momentum) : buf;
    }
    if (!neg_lr_typed.defined() || neg_lr_typed.scalar_type() != p.scalar_type()) {
      neg_lr_typed = neg_lr.to(p.scalar_type());
    }
    p.addcmul_(d_p, neg_lr_typed);  // p - lr * d_p in one kernel, lr read on the device
  }
}

}  // namespace ddp::optim
