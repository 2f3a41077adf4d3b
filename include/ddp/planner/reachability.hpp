#pragma once
// Which parameters a forward's outputs depend on: those whose gradient accumulator the walk of the
// outputs' autograd graph reaches. find_unused_parameters asks after every forward; static_graph
// asks once, after the first.

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/planner/autograd_graph.hpp"

namespace ddp::planner {

// reachable[i] is true when parameter i's accumulator is in the graph; size graph.num_params().
std::vector<bool> reachable_params(const AutogradGraph& graph);

// The same from the tensors: one walk of `outputs` with an index over `params` (each parameter
// once, defined). An output that is itself a parameter is reachable.
std::vector<bool> reachable_params(const std::vector<at::Tensor>& outputs,
                                   const std::vector<at::Tensor>& params);

}  // namespace ddp::planner
