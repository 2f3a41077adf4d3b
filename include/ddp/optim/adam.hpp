#pragma once
// Adam and AdamW: torch::optim::Adam / torch::optim::AdamW (betas, eps, weight decay, AMSGrad,
// parameter groups with their own rate and decay) whose step count and rates live on the device,
// so that one step serves eager runs, captured CUDA graphs and device-side skips alike
// (optim/device_step.hpp). The one Adam of the house: AdamW is Adam with decoupled decay, and both
// run the same update (adam.cpp).
//
//   auto opt = ddp::optim::AdamW(ddp::optim::weight_decay_groups(
//       params, torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1)),
//       torch::optim::AdamWOptions(6e-4));
//
// The update, per parameter group:
//   CUDA, torch >= 2.4   one fused multi-tensor kernel (at::_fused_adam(w)_, PyTorch's
//                        fused=True), reading the rate, the step count and the skip flag on the
//                        device
//   otherwise            torch::optim's arithmetic term by term (adam.cpp, adamw.cpp of 1.13), the
//                        host scalars replaced by device ones: equal to torch::optim within rel.
//                        1e-6 (the last step divides and multiplies where torch runs one addcdiv
//                        with a host scalar; tests/optim)
// One step count for all parameters (torch counts per parameter, which differs only when a
// parameter skips a step: refused, naming it). The state is torch's AdamParamState /
// AdamWParamState, so checkpoints save "step", "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq")
// as PyTorch names them, and either class loads torch::optim's state.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <vector>

#include "ddp/optim/device_step.hpp"

namespace ddp::optim {

// Adam (Torch = torch::optim::Adam: L2 decay added to the gradient) or AdamW (torch::optim::AdamW:
// decoupled decay, the parameter shrunk by lr * weight_decay); instantiated for those two only.
template <typename Torch, typename Options, typename State>
class BasicAdam : public Torch, public DeviceStep {
 public:
  BasicAdam(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults);
  BasicAdam(std::vector<at::Tensor> params, Options defaults);
  torch::Tensor step(typename Torch::LossClosure closure = nullptr) override;
  void steps_to_state() override;
  void steps_from_state() override;

 private:
  void step_group(size_t group);
};

extern template class BasicAdam<torch::optim::Adam, torch::optim::AdamOptions,
                                torch::optim::AdamParamState>;
extern template class BasicAdam<torch::optim::AdamW, torch::optim::AdamWOptions,
                                torch::optim::AdamWParamState>;
using Adam = BasicAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>;
using AdamW =
    BasicAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

}  // namespace ddp::optim
