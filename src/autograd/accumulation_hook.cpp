#include "ddp/autograd/accumulation_hook.hpp"

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

namespace ddp::autograd {

bool gradient_is_captured(const at::Tensor& leaf) {
  // Empty exec_info: a backward() without inputs, which executes every node and captures none.
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info == nullptr || exec_info->empty()) return false;
  if (!leaf.defined() || !leaf.requires_grad() || !leaf.is_leaf()) return false;
  const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(leaf);
  if (!accumulator) return false;
  const auto it = exec_info->find(accumulator.get());
  // grad() marks its inputs' accumulators as captures and leaves them unexecuted; backward(inputs)
  // marks them needed (they accumulate).
  return it != exec_info->end() && it->second.captures_ != nullptr && !it->second.needed_;
}

unsigned add_accumulation_hook(const at::Tensor& leaf, std::function<void(const at::Tensor&)> fn) {
  TORCH_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
              "ddp: an accumulation hook goes on a leaf that requires grad");
  // Weak: the hook lives on the tensor, so a strong reference would keep the tensor alive forever.
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> weak(leaf.getIntrusivePtr());
  return leaf.register_hook([weak, fn = std::move(fn)](const at::Tensor& grad) {
    const auto impl = weak.lock();
    if (impl.defined() && gradient_is_captured(at::Tensor(impl))) return;
    fn(grad);
  });
}

}  // namespace ddp::autograd
