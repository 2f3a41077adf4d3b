#pragma once
// Capturable optimizers: SGD (momentum, dampening, Nesterov, weight decay) and Adam / AdamW whose
// every per-step number lives on the parameters' device, so that a CUDA graph that captured one
// step replays step N, not step 1 again.
//
// Why not torch::optim: libtorch's Adam keeps its step count on the host (AdamParamState::step, an
// int64) and computes the bias corrections with std::pow there, and every optimizer passes its
// learning rate as a host double; a captured kernel keeps the numbers of the step it was captured
// in, so a replayed Adam would apply step 1's bias correction forever and a learning-rate schedule
// would never reach the GPU (PyTorch's Python Adam has capturable=True for this; libtorch has no
// such mode). Here the step count, the learning rate and the bias corrections are 0-dim float64
// tensors on the device: set_lr() writes one of them (a schedule costs one fill per step, outside
// or inside the graph), and step() reads them with tensor ops only: no host sync, no host branch
// that changes between steps.
//
// The arithmetic is libtorch 1.13's, term by term (SGD: torch/csrc/api/src/optim/sgd.cpp; Adam and
// AdamW: adam.cpp, adamw.cpp), with each host scalar replaced by the device one, so a run equals
// torch::optim's eager run to rounding (rel. err < 1e-6 after many steps; tests/optim). The one
// host branch left is whether a parameter's state exists yet: the first step creates it (the
// momentum buffer is a copy of the first gradient, as in torch::optim), so capture after at
// least one eager step (graphs/captured_step.hpp warms up first).
//
// Gradients: zero_grad() zeroes them in place (never frees them): a graph's replays read and
// write the same gradient buffers (libtorch's Optimizer::zero_grad() frees them by default).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <tuple>
#include <vector>

namespace ddp::optim {

struct CapturableSgdOptions {
  // Learning rate; default 0.01. Changed later by set_lr (a device write).
  double lr = 0.01;
  // Momentum factor; default 0 (plain SGD), as torch::optim::SGDOptions.
  double momentum = 0;
  // Dampening of the momentum's gradient term; default 0, as torch::optim.
  double dampening = 0;
  // L2 penalty added to the gradient; default 0, as torch::optim.
  double weight_decay = 0;
  // Nesterov momentum (needs momentum > 0 and dampening 0); default false, as torch::optim.
  bool nesterov = false;
};

struct CapturableAdamOptions {
  // Learning rate; default 1e-3, as torch::optim::AdamOptions. Changed later by set_lr.
  double lr = 1e-3;
  // Decay rates of the first and second moment; default (0.9, 0.999), as torch::optim.
  std::tuple<double, double> betas{0.9, 0.999};
  // Added to the denominator for stability; default 1e-8, as torch::optim.
  double eps = 1e-8;
  // Adam: L2 penalty added to the gradient; AdamW (decoupled): the parameter shrinks by
  // lr * weight_decay each step. Default 0 (torch::optim::AdamWOptions defaults to 1e-2: set it).
  double weight_decay = 0;
  // The maximum of the second moments so far in the denominator; default false, as torch::optim.
  bool amsgrad = false;
  // AdamW: decoupled weight decay (Loshchilov and Hutter), as torch::optim::AdamW; default false
  // (Adam).
  bool decoupled_weight_decay = false;
};

// What a captured step needs of an optimizer: a step and an in-place zero_grad that sync nothing
// with the host, and a learning rate held on the device.
class CapturableOptimizer {
 public:
  virtual ~CapturableOptimizer() = default;
  // One update of every parameter with a gradient (parameters without one are skipped, as in
  // torch::optim; under capture the set is the one captured).
  virtual void step() = 0;
  // Zeroes every defined gradient in place (default), or drops them (set_to_none). In place keeps
  // the buffers a DDP bucket view or a graph's replays write. Dropped inside a captured step, the
  // backward makes new gradients in the graph's pool and AccumulateGrad takes them over without a
  // copy or an add (PyTorch's recipe: zero_grad(set_to_none=True) before its capture): the cheaper
  // choice for a bare model, whose gradients nobody else holds.
  void zero_grad(bool set_to_none = false);
  // Writes the learning rate into its device scalar: the next step (eager or replayed) uses it.
  void set_lr(double lr);
  // The device scalar (0-dim float64) that holds the learning rate.
  const at::Tensor& lr() const { return lr_; }
  // Steps taken so far, as a device scalar (0-dim float64); reading it on the host syncs.
  const at::Tensor& step_count() const { return step_; }
  const std::vector<at::Tensor>& params() const { return params_; }

 protected:
  CapturableOptimizer(std::vector<at::Tensor> params, double lr);
  std::vector<at::Tensor> params_;  // distinct, all on one device
  // A device scalar in params_[i]'s dtype (made per step from a float64 one), so that kernels
  // multiply like dtypes, as torch::optim's host scalars do.
  at::Tensor typed(const at::Tensor& scalar, size_t i) const;

  at::Tensor lr_;    // 0-dim float64 on the parameters' device
  at::Tensor step_;  // 0-dim float64 on the parameters' device: steps taken
};

class CapturableSgd : public CapturableOptimizer {
 public:
  CapturableSgd(std::vector<at::Tensor> params, CapturableSgdOptions options);
  void step() override;
  // The momentum buffer of params()[i], undefined before its first step or without momentum.
  const at::Tensor& momentum_buffer(size_t i) const { return momentum_[i]; }

 private:
  CapturableSgdOptions options_;
  std::vector<at::Tensor> momentum_;  // per parameter; made by its first step
};

class CapturableAdam : public CapturableOptimizer {
 public:
  CapturableAdam(std::vector<at::Tensor> params, CapturableAdamOptions options);
  void step() override;

 private:
  CapturableAdamOptions options_;
  // Per parameter, made by its first step. One step count for all parameters (step_), so that a
  // step costs a handful of scalar kernels, not a handful per parameter: torch::optim counts per
  // parameter, which differs only when a parameter skips a step, and step() refuses that (a
  // parameter whose gradient appears or disappears after the first step), naming it.
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  std::vector<bool> stepping_;  // which parameters had a gradient at the first step
};

}  // namespace ddp::optim
