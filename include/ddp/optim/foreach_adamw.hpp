#pragma once
// ForeachAdamW: torch::optim::AdamW whose step updates all the parameters of a group with a
// handful of multi-tensor (_foreach) kernels instead of about ten kernels per parameter, the way
// PyTorch's AdamW runs by default on CUDA (foreach=True). A GPT step is launch-bound at the sizes
// most people train (gpt-char: 77 parameters, so ~770 launches of a few microseconds each for the
// per-parameter update), and that is where the two differ.
//
// The same arithmetic as torch::optim::AdamW, operation for operation (decoupled decay as a
// multiply, the moments by mul and add, the bias corrections per parameter from its own step
// count): on the CPU, where a foreach op loops over the same per-tensor kernels, the result is
// bit for bit AdamW's. The state is AdamW's (AdamWParamState, created the same way), so
// checkpoints treat it as AdamW (io::optimizer_kind) and either loads the other's. AMSGrad falls
// back to AdamW's own step.

#include <torch/optim/adamw.h>

namespace ddp::optim {

class ForeachAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace ddp::optim
