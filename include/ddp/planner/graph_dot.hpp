#pragma once
// The autograd graph behind a forward's outputs as Graphviz DOT (ddp-bench --graph-dot, the seed
// harness's --torchviz): backward nodes as ellipses, parameters (AccumulateGrad leaves) as boxes
// labelled with their names and shapes; arrows point the forward way (input -> op).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ddp/planner/autograd_graph.hpp"

namespace ddp::planner {

// One DOT node per graph node (named n<id>), one DOT edge per graph edge. `names[i]` labels
// parameter i; an accumulator of a parameter without a name, or of a leaf that is no parameter,
// is labelled "leaf".
std::string graph_dot(const AutogradGraph& graph, const std::vector<std::string>& names);

// The same from the tensors: the graph behind `root`, parameters named by `names` (parallel to
// `params`, each parameter once).
std::string autograd_graph_dot(const at::Tensor& root, const std::vector<at::Tensor>& params,
                               const std::vector<std::string>& names);

}  // namespace ddp::planner
