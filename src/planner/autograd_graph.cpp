#include "ddp/planner/autograd_graph.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

namespace ddp::planner {

AutogradGraph::AutogradGraph(const std::vector<at::Tensor>& outputs, const ParamIndex& params)
    : num_params_(params.size()) {
  roots_.reserve(outputs.size());
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad()) {
      roots_.push_back(torch::autograd::impl::gradient_edge(out));
    }
  }

  // Engine::compute_dependencies: every edge counts once more for its node; the first edge that
  // reaches a node (the engine's `seen` set) also records it. Iterative: deep models (hundreds of
  // layers) would overflow a recursive walk.
  std::vector<Node*> stack;
  auto count_edge = [&](const Edge& edge) {
    Node* next = edge.function.get();
    if (next == nullptr) return;  // an input that needs no gradient
    const auto [it, inserted] = id_of_.emplace(next, nodes_.size());
    if (inserted) {
      nodes_.push_back(next);
      dependencies_.push_back(0);
      const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(next);
      param_of_.push_back(acc != nullptr ? params.find(acc->variable) : ParamIndex::kNone);
      stack.push_back(next);
    }
    ++dependencies_[it->second];
  };
  for (const auto& edge : roots_) count_edge(edge);
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) count_edge(edge);
  }
}

size_t AutogradGraph::id_of(const Node* node) const {
  const auto it = id_of_.find(node);
  TORCH_INTERNAL_ASSERT(it != id_of_.end(), "AutogradGraph: ", node->name(), " is not in the walk");
  return it->second;
}

}  // namespace ddp::planner
