#pragma once
// The reducer's only contact with the autograd engine: a post-hook on each parameter's gradient
// accumulator (runs after AccumulateGrad wrote param.grad, i.e. when the gradient is final for
// this backward: the engine sums all uses of a parameter before its accumulator runs), and the
// engine's end-of-backward callback.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace ddp::reducer {

class AutogradHooks {
 public:
  // Installs one post-hook per parameter; `on_ready(i)` runs on the autograd thread that ran
  // params[i]'s accumulator. `names` only name a parameter without an accumulator in the error.
  AutogradHooks(const std::vector<at::Tensor>& params, const std::vector<std::string>& names,
                std::function<void(size_t)> on_ready);
  ~AutogradHooks();  // removes every hook: none runs after this
  AutogradHooks(const AutogradHooks&) = delete;
  AutogradHooks& operator=(const AutogradHooks&) = delete;

  // From inside a backward: runs `fn` once the engine has finished the current graph task.
  static void at_end_of_backward(std::function<void()> fn);

 private:
  std::function<void(size_t)> on_ready_;
  // The accumulator nodes are kept alive so the keys stay valid for removal.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace ddp::reducer
