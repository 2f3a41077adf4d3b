#pragma once
// Sgd: torch::optim::SGD (momentum, dampening, Nesterov, weight decay, parameter groups) whose
// rate lives on the device and whose step can be captured in a CUDA graph and skipped on the
// device (optim/device_step.hpp). The one SGD of the house: eager, captured and
// optimizer-in-backward steps all run this class.
//
//   ddp::optim::Sgd opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   ... loss.backward(); opt.step();
//
// The update, per parameter group:
//   CUDA, torch >= 2.4   one fused multi-tensor kernel (at::_fused_sgd_, PyTorch's fused=True):
//                        reads the rate and the skip flag on the device
//   otherwise            torch::optim::SGD's arithmetic term by term, the rate a device scalar:
//                        equal to torch::optim::SGD within rel. 1e-6 (the last step multiplies by a
//                        device rate where torch adds with a host alpha; tests/optim say so)
// The momentum buffer is torch's SGDParamState (checkpoints save it as PyTorch's
// "momentum_buffer"); its first value is the first gradient, as torch's. A step skipped before the
// buffer existed leaves it zero, so the next step's buffer is (1 - dampening) * gradient (equal to
// torch's unless dampening != 0).

#include <torch/optim/sgd.h>

#include <vector>

#include "ddp/optim/device_step.hpp"

namespace ddp::optim {

class Sgd : public torch::optim::SGD, public DeviceStep {
 public:
  Sgd(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions defaults);
  Sgd(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults);
  torch::Tensor step(LossClosure closure = nullptr) override;

 private:
  void step_group(size_t group);
};

}  // namespace ddp::optim
