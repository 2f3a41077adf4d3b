#include "ddp/optim/param_groups.hpp"

#include "ddp/optim/device_step.hpp"

namespace ddp::optim {

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> split_by_dims(
    const std::vector<at::Tensor>& params) {
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> out;
  for (const auto& p : params) (p.dim() >= 2 ? out.first : out.second).push_back(p);
  return out;
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  // Ours keep the rate on the device too: one write there, no host copy to fall behind.
  if (auto* device = dynamic_cast<DeviceStep*>(&optimizer)) {
    device->set_lr(lr);
    return;
  }
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace ddp::optim
