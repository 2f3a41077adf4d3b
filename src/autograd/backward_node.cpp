#include "ddp/autograd/backward_node.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <string>
#include <utility>

namespace ddp::autograd {
namespace {

struct FunctionNode : torch::autograd::Node {
  FunctionNode(BackwardFn backward, const char* name)
      : backward_(std::move(backward)), name_(name) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    return {backward_(grads[0])};
  }
  std::string name() const override { return name_; }

 private:
  BackwardFn backward_;
  const char* name_;
};

}  // namespace

at::Tensor attach_backward(at::Tensor value, const at::Tensor& input, BackwardFn backward,
                           const char* name) {
  if (!at::GradMode::is_enabled() || !input.defined() || !input.requires_grad()) return value;
  auto node = std::shared_ptr<FunctionNode>(new FunctionNode(std::move(backward), name),
                                            torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(value, node);
  return value;
}

at::Tensor on_backward(const at::Tensor& output, std::function<void()> fn) {
  if (!at::GradMode::is_enabled() || !output.defined() || !output.requires_grad()) return output;
  // A new tensor sharing the output's memory, whose history is the callback node alone.
  return attach_backward(
      output.detach(), output,
      [fn = std::move(fn)](const at::Tensor& grad) {
        fn();
        return grad;
      },
      "ddp::unit::BackwardCallback");
}

}  // namespace ddp::autograd
