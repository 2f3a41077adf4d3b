#include "ddp/planner/graph_dot.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <sstream>

namespace ddp::planner {

std::string graph_dot(const AutogradGraph& graph, const std::vector<std::string>& names) {
  std::ostringstream out;
  out << "digraph autograd {\n  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=10];\n";
  const auto& nodes = graph.nodes();
  for (size_t id = 0; id < nodes.size(); ++id) {
    const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(nodes[id]);
    if (acc == nullptr) {
      out << "  n" << id << " [label=\"" << nodes[id]->name() << "\"];\n";
      continue;
    }
    const size_t param = graph.param_of()[id];
    const std::string& label =
        param != ParamIndex::kNone && param < names.size() ? names[param] : std::string("leaf");
    out << "  n" << id << " [shape=box, style=filled, fillcolor=\"#cfe8ff\", label=\"" << label
        << "\\n"
        << acc->variable.sizes() << "\"];\n";
  }
  for (size_t id = 0; id < nodes.size(); ++id) {
    for (const auto& edge : nodes[id]->next_edges()) {
      if (edge.function == nullptr) continue;
      // Drawn the forward way, input -> op; gradients flow against the arrow.
      out << "  n" << graph.id_of(edge.function.get()) << " -> n" << id << ";\n";
    }
  }
  out << "}\n";
  return out.str();
}

std::string autograd_graph_dot(const at::Tensor& root, const std::vector<at::Tensor>& params,
                               const std::vector<std::string>& names) {
  return graph_dot(AutogradGraph({root}, ParamIndex(params, "autograd_graph_dot")), names);
}

}  // namespace ddp::planner
