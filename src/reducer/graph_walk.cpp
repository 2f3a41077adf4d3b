#include "ddp/reducer/graph_walk.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace ddp::reducer {

std::vector<bool> reachable_params(const std::vector<at::Tensor>& outputs,
                                   const std::vector<at::Tensor>& params) {
  using torch::autograd::Node;
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].unsafeGetTensorImpl()] = i;

  std::vector<bool> reachable(params.size(), false);
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (out.is_leaf()) {  // a parameter returned as an output is its own gradient source
      auto it = index_of.find(out.unsafeGetTensorImpl());
      if (it != index_of.end()) reachable[it->second] = true;
      continue;
    }
    if (Node* fn = out.grad_fn().get(); fn && seen.insert(fn).second) stack.push_back(fn);
  }
  // Iterative DFS: deep models (hundreds of layers) would overflow a recursive walk.
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      auto it = index_of.find(acc->variable.unsafeGetTensorImpl());
      if (it != index_of.end()) reachable[it->second] = true;
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      Node* next = edge.function.get();
      if (next && seen.insert(next).second) stack.push_back(next);
    }
  }
  return reachable;
}

}  // namespace ddp::reducer
