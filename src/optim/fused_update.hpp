#pragma once
// The fused multi-tensor updates of torch >= 2.4 on CUDA (at::_fused_sgd_, at::_fused_adam_,
// at::_fused_adamw_: PyTorch's fused=True): one kernel per parameter group for the whole update,
// reading the rate, the step count and the skip flag (found_inf) on the device. Private to
// optim/: Sgd and Adam(W) call them where they apply and take their per-tensor path elsewhere.

#include <ATen/core/Tensor.h>

#include <vector>

namespace ddp::optim {

// Whether the fused kernels serve `params` with `grads`: this torch has them, every tensor is a
// dense CUDA tensor of one floating dtype on one device (what the kernels take).
bool fused_update_applies(const std::vector<at::Tensor>& params,
                          const std::vector<at::Tensor>& grads);

// SGD over the lists; `lr` a 0-dim float32 device tensor, `found_inf` (undefined: none) a 0-dim
// float device tensor: the kernel does nothing where it is 1. `bufs` empty without momentum.
void fused_sgd(std::vector<at::Tensor>& params, std::vector<at::Tensor>& grads,
               std::vector<at::Tensor>& bufs, double weight_decay, double momentum,
               const at::Tensor& lr, double dampening, bool nesterov, bool first_step,
               const at::Tensor& found_inf);

// Adam (decoupled: AdamW) over the lists; `step` the 0-dim float32 count after this step, read by
// every parameter; `max_exp_avg_sqs` empty without amsgrad.
void fused_adam(std::vector<at::Tensor>& params, std::vector<at::Tensor>& grads,
                std::vector<at::Tensor>& exp_avgs, std::vector<at::Tensor>& exp_avg_sqs,
                std::vector<at::Tensor>& max_exp_avg_sqs, const at::Tensor& step,
                const at::Tensor& lr, double beta1, double beta2, double weight_decay, double eps,
                bool amsgrad, bool decoupled, const at::Tensor& found_inf);

}  // namespace ddp::optim
