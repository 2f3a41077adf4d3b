#include "ddp/optim/device_step.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace ddp::optim {

DeviceStep::DeviceStep(torch::optim::Optimizer& self) : self_(self) {
  const auto& groups = self_.param_groups();
  TORCH_CHECK(!groups.empty() && !groups.front().params().empty(),
              "ddp: an optimizer needs at least one parameter");
  const at::Tensor& first = groups.front().params().front();
  for (const auto& group : groups) {
    for (const auto& p : group.params()) {
      TORCH_CHECK(p.device() == first.device(), "ddp: an optimizer's parameters are on ",
                  first.device(), " and ", p.device(),
                  "; it keeps its step count and rates on one device");
    }
  }
  const auto f64 = first.options().dtype(at::kDouble);
  step_ = at::zeros({}, f64);
  step32_ = at::zeros({}, f64.dtype(at::kFloat));
  host_scalars_ = first.device().is_cpu();
  sync_groups();
}

c10::Device DeviceStep::device() const { return step_.device(); }

void DeviceStep::sync_groups() {
  auto& groups = self_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double lr = groups[g].options().get_lr();
    if (g == lr64_.size()) {
      lr64_.push_back(at::full({}, lr, step_.options()));
      lr32_.push_back(at::full({}, lr, step32_.options()));
      host_lr_.push_back(lr);
    } else if (host_lr_[g] != lr) {
      set_lr(g, lr);
    }
  }
}

void DeviceStep::set_lr(double lr) {
  for (size_t g = 0; g < self_.param_groups().size(); ++g) set_lr(g, lr);
}

void DeviceStep::set_lr(size_t group, double lr) {
  TORCH_CHECK(group < self_.param_groups().size(), "ddp: set_lr: group ", group, " of ",
              self_.param_groups().size());
  if (group >= lr64_.size()) sync_groups();
  self_.param_groups()[group].options().set_lr(lr);
  lr64_[group].fill_(lr);
  lr32_[group].fill_(lr);
  host_lr_[group] = lr;
}

const at::Tensor& DeviceStep::lr(size_t group) const {
  TORCH_CHECK(group < lr64_.size(), "ddp: lr: group ", group, " of ", lr64_.size());
  return lr64_[group];
}

int64_t DeviceStep::steps_taken() const { return static_cast<int64_t>(step_.item<double>()); }

void DeviceStep::skip_when(at::Tensor flag) {
  if (flag.defined()) {
    TORCH_CHECK(flag.dim() == 0 && flag.device() == device() && flag.is_floating_point(),
                "ddp: skip_when: the flag must be a 0-dim floating-point tensor on ", device(),
                ", got ", flag.dim(), " dims on ", flag.device());
  }
  skip_ = std::move(flag);
}

at::Tensor DeviceStep::skipping() const { return skip_ > 0; }

at::Tensor DeviceStep::step_groups(const torch::optim::Optimizer::LossClosure& closure,
                                   const std::function<void(size_t)>& step_group) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  sync_groups();
  count_step();
  for (size_t g = 0; g < self_.param_groups().size(); ++g) step_group(g);
  return loss;
}

void DeviceStep::count_step() {
  if (skip_.defined()) {
    step_.add_(1).sub_(skip_);
  } else {
    step_.add_(1);
  }
  step32_.copy_(step_);
}

void DeviceStep::set_steps_taken(int64_t steps) {
  step_.fill_(static_cast<double>(steps));
  step32_.fill_(static_cast<double>(steps));
}

std::vector<at::Tensor> DeviceStep::stepping(size_t group) {
  const auto& params = self_.param_groups()[group].params();
  if (had_grad_.size() <= group) had_grad_.resize(group + 1);
  std::vector<bool>& had = had_grad_[group];
  const bool first = had.empty();
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool has = params[i].grad().defined();
    if (first) {
      had.push_back(has);
    } else {
      TORCH_CHECK(i < had.size() && had[i] == has, "ddp: optimizer: parameter ", i, " of group ",
                  group, " (shape ", params[i].sizes(), ") ",
                  has ? "has a gradient in this step but had none in the first"
                      : "has no gradient in this step but had one in the first",
                  "; one step count serves all parameters, so each must get a gradient in "
                  "every step or in none");
    }
    if (has) out.push_back(params[i]);
  }
  return out;
}

void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        g.reset();
      } else {
        g.zero_();
      }
    }
  }
}

}  // namespace ddp::optim
