#pragma once
// One walk of the autograd graph behind a forward's outputs, with the parameter index: the nodes
// a backward from those outputs would run, the incoming-edge counts the engine would compute for
// them, and which nodes are the parameters' gradient accumulators. Every graph question the
// library asks is a function over one such walk:
//   reachable_params     (reachability.hpp)  which parameters the outputs depend on
//   predict_ready_order  (ready_order.hpp)   the order their gradients become ready
//   graph_dot            (graph_dot.hpp)     the graph as Graphviz DOT
// The walk only reads the graph, so backward can still run on it afterwards.

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "ddp/planner/param_index.hpp"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace ddp::planner {

class AutogradGraph {
 public:
  using Node = torch::autograd::Node;
  using Edge = torch::autograd::Edge;

  // The roots are the gradient edges Engine::execute would get for backward(outputs): an
  // output's grad_fn, or for a leaf (a parameter returned as an output) its grad accumulator.
  // Undefined outputs and outputs that do not require grad are skipped. The graph holds raw
  // pointers into the outputs' graph: it must not outlive `outputs`. `params` is only read during
  // construction.
  AutogradGraph(const std::vector<at::Tensor>& outputs, const ParamIndex& params);

  const std::vector<Edge>& roots() const { return roots_; }

  // Nodes reachable from the roots, each once, in the order an iterative depth-first walk
  // discovers them (the same graph gives the same order). Ids below are positions in this list.
  const std::vector<Node*>& nodes() const { return nodes_; }
  size_t size() const { return nodes_.size(); }

  // Engine::compute_dependencies' count for nodes()[id]: one per incoming edge (a node fed twice
  // by one node counts 2), the edges from the roots included.
  const std::vector<uint32_t>& dependencies() const { return dependencies_; }

  // The parameter index of nodes()[id] when it is that parameter's AccumulateGrad node;
  // ParamIndex::kNone for every other node (backward ops, leaves that are not parameters).
  const std::vector<size_t>& param_of() const { return param_of_; }

  // How many parameters the index held: the size of per-parameter answers.
  size_t num_params() const { return num_params_; }

  // The id of a reachable node (any next edge of a node in nodes()).
  size_t id_of(const Node* node) const;

 private:
  std::vector<Edge> roots_;  // keeps a leaf output's fresh grad accumulator alive for the walk
  std::vector<Node*> nodes_;
  std::vector<uint32_t> dependencies_;             // parallel to nodes_
  std::vector<size_t> param_of_;                   // parallel to nodes_
  std::unordered_map<const Node*, size_t> id_of_;  // nodes_[id_of_[n]] == n
  size_t num_params_ = 0;
};

}  // namespace ddp::planner
