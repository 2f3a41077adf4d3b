#pragma once
// DeviceStep: what makes one optimizer serve eager and captured steps alike. Every number that
// changes between steps lives on the parameters' device: the learning rate of each parameter
// group, the count of steps taken, and an optional skip flag (a non-finite gradient norm, set by
// optim/grad_clip.hpp's GradClipper). step() reads them with tensor ops only, so it never waits
// for the host, and a CUDA graph that captured one step replays step N, not step 1 again.
//
// Why not torch::optim as it is: libtorch's Adam keeps its step count on the host (an int64 per
// parameter) and computes the bias corrections with std::pow there, and every torch::optim
// optimizer passes its learning rate as a host double: a captured kernel keeps the numbers of the
// step it was captured in. PyTorch's Python optimizers have capturable=True and a tensor lr for
// this; libtorch has neither.
//
// The optimizers (optim/sgd.hpp, optim/adam.hpp) derive from torch::optim's own classes, so that
// parameter groups, options and the per-parameter state are torch's (checkpoints save and load
// them under PyTorch's names: io/checkpoint_state.hpp), and mix this class in for the device
// side. The one host copy of a device number: each state's `step`, written from the device count
// only when a checkpoint is saved (steps_to_state) and read back when one is loaded
// (steps_from_state).
//
//   set_lr(lr)        one device write per group (a fill, outside or between replays); the host
//                     options' lr follows, so that a reader of param_groups() sees the same rate
//   skip_when(flag)   every later step() is a no-op on the device while flag (0-dim float) is 1:
//                     parameters and state untouched, the step not counted
//   step()            the derived class's update; the count goes up by 1 - flag

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace ddp::optim {

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;
  DeviceStep(const DeviceStep&) = delete;
  DeviceStep& operator=(const DeviceStep&) = delete;

  // Every group's rate (a device fill each, no host wait); the host options follow.
  void set_lr(double lr);
  // One group's rate.
  void set_lr(size_t group, double lr);
  // Group `group`'s rate as a 0-dim float64 device tensor (what the per-tensor update reads).
  const at::Tensor& lr(size_t group) const;
  // Steps taken so far as a 0-dim float64 device tensor (skipped steps not counted).
  const at::Tensor& step_count() const { return step_; }
  // The same read on the host (a device sync: for logs and tests, not for every step).
  int64_t steps_taken() const;
  // Every later step() makes no change while `flag` (a 0-dim float tensor on the parameters'
  // device, 0 or 1) is 1. An undefined tensor removes the flag.
  void skip_when(at::Tensor flag);
  const at::Tensor& skip_flag() const { return skip_; }

  // Where the per-tensor update (no fused kernel here) reads its scalars: on the host (default on
  // the CPU, where reading a CPU tensor costs no sync: then the arithmetic is torch::optim's op
  // for op, bit for bit) or as device tensors (default elsewhere: what a captured step needs;
  // tests set it on the CPU to check that path against torch::optim).
  void use_host_scalars(bool host) { host_scalars_ = host; }
  bool host_scalars() const { return host_scalars_; }

  // Checkpoints: the device count into each stepped parameter's state (`step`, PyTorch's name),
  // before a save (a host read); and back from the states after a load (they must agree: one
  // count for all parameters). No-ops for an algorithm without a step count (SGD).
  virtual void steps_to_state() {}
  virtual void steps_from_state() {}

 protected:
  // `self` is the torch::optim optimizer this object is mixed into (its groups and state).
  explicit DeviceStep(torch::optim::Optimizer& self);
  // Before each update: a device scalar pair per group (groups added later get theirs), and a
  // rate changed through the host options (torch's API, an eager step) written to the device.
  // Under capture nothing changes here: replays read the scalars set_lr writes between them.
  void sync_groups();
  // The step every algorithm shares, torch::optim's way: the closure (if any) under grad mode,
  // then without grad the groups synced, the step counted and `step_group` run on each group.
  at::Tensor step_groups(const torch::optim::Optimizer::LossClosure& closure,
                         const std::function<void(size_t)>& step_group);
  // Counts this step on the device: +1, or +(1 - flag) with a skip flag.
  void count_step();
  // Sets the count (a loaded checkpoint's).
  void set_steps_taken(int64_t steps);
  // Group `group`'s rate in float32 (what the fused kernels read).
  const at::Tensor& lr32(size_t group) const { return lr32_[group]; }
  // The step count in float32 (the fused kernels' state_steps), refreshed by count_step.
  const at::Tensor& step32() const { return step32_; }
  // Whether a skip flag is set; `skipping()` as a 0-dim bool for at::where.
  bool has_skip() const { return skip_.defined(); }
  at::Tensor skipping() const;
  // The one device every parameter is on (checked at the first step).
  c10::Device device() const;
  // The parameters of group `group` that have a gradient; the same set at every step after the
  // first (a parameter whose gradient appears or disappears later is refused, naming it: one
  // step count serves all parameters).
  std::vector<at::Tensor> stepping(size_t group);

  torch::optim::Optimizer& self_;

 private:
  at::Tensor step_, step32_;             // steps taken: float64 (per-tensor math), float32 (fused)
  std::vector<at::Tensor> lr64_, lr32_;  // per group: the rate on the device
  std::vector<double> host_lr_;          // per group: the rate lr64_ holds, as last written
  std::vector<std::vector<bool>> had_grad_;  // per group and parameter: at the first step
  at::Tensor skip_;                          // undefined: no flag
  bool host_scalars_ = false;                // set from the device in the constructor
};

// Zeroes every defined gradient of `optimizer`'s parameters in place, or drops them
// (set_to_none). In place keeps the buffers a DDP bucket view or a graph's replays write; dropped
// inside a captured step, backward makes new ones in the graph's pool (PyTorch's recipe). One
// spelling for libtorch 1.13 (zero_grad() zeroes) and 2.x (zero_grad(set_to_none = true)).
void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none);

}  // namespace ddp::optim
