#include "ddp/obs/graph_dot.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <sstream>
#include <unordered_map>

namespace ddp::obs {

std::string autograd_graph_dot(const at::Tensor& root, const std::vector<at::Tensor>& params,
                               const std::vector<std::string>& names) {
  using torch::autograd::Node;
  std::unordered_map<const c10::TensorImpl*, std::string> name_of;
  for (size_t i = 0; i < params.size() && i < names.size(); ++i) {
    name_of[params[i].unsafeGetTensorImpl()] = names[i];
  }
  std::ostringstream out;
  out << "digraph autograd {\n  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=10];\n";
  std::unordered_map<const Node*, size_t> id;
  std::vector<Node*> stack;
  auto visit = [&](Node* n) {
    if (n == nullptr || id.count(n)) return;
    const size_t k = id.size();
    id[n] = k;
    stack.push_back(n);
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
      auto it = name_of.find(acc->variable.unsafeGetTensorImpl());
      const std::string label = it != name_of.end() ? it->second : "leaf";
      out << "  n" << k << " [shape=box, style=filled, fillcolor=\"#cfe8ff\", label=\"" << label
          << "\\n"
          << acc->variable.sizes() << "\"];\n";
    } else {
      out << "  n" << k << " [label=\"" << n->name() << "\"];\n";
    }
  };
  visit(root.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& edge : n->next_edges()) {
      Node* next = edge.function.get();
      if (next == nullptr) continue;
      visit(next);
      out << "  n" << id[next] << " -> n" << id[n] << ";\n";  // gradient flows next <- n
    }
  }
  out << "}\n";
  return out.str();
}

}  // namespace ddp::obs
