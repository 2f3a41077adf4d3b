#include "ddp/gradients/autograd_hooks.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace ddp::gradients {

namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(const std::function<void(size_t)>* on_ready, size_t index)
      : on_ready_(on_ready), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    (*on_ready_)(index_);
    return outputs;
  }

 private:
  const std::function<void(size_t)>* on_ready_;  // outlives the hook: ~AutogradHooks removes it
  size_t index_;
};

}  // namespace

namespace {

// The current stream of the parameters' device (the default stream of the CPU, which has one).
c10::Stream current_stream(const std::vector<at::Tensor>& params) {
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params[0].device();
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

}  // namespace

AutogradHooks::AutogradHooks(const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names,
                             std::function<void(size_t)> on_ready)
    : params_(params),
      names_(names),
      on_ready_(std::move(on_ready)),
      stream_(current_stream(params)) {
  install();
}

AutogradHooks::~AutogradHooks() { remove(); }

void AutogradHooks::install() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    TORCH_CHECK(acc, "ddp: parameter '", names_[i], "' has no gradient accumulator");
    keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(&on_ready_, i)));
    accumulators_.push_back(std::move(acc));
  }
}

void AutogradHooks::remove() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
  accumulators_.clear();
  keys_.clear();
}

void AutogradHooks::follow_current_stream() {
  const c10::Stream now = current_stream(params_);
  if (now == stream_) return;
  remove();  // the last owner of each accumulator lets go: the next grad_accumulator makes one
  stream_ = now;
  install();
}

}  // namespace ddp::gradients
