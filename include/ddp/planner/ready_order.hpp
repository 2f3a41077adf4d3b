#pragma once
// The order in which parameter gradients will become ready in the next backward, predicted from
// the autograd graph of a forward's outputs before that backward runs (the DDPOptimizer idea:
// lay out buckets in ready order from the first iteration instead of learning it from a first
// backward). See [Note: simulating the ready queue] in src/planner/ready_order.cpp.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

#include "ddp/planner/autograd_graph.hpp"

namespace ddp::planner {

// Returns parameter indices (the graph's ParamIndex) in the predicted order in which their
// gradient accumulators run during a backward from the graph's outputs on the CPU engine.
// Parameters unreachable from the outputs are not in the result (the caller appends them).
// Outputs that are parameters themselves are roots of the walk like any other output; when no
// other path leads to them they come first.
std::vector<size_t> predict_ready_order(const AutogradGraph& graph);

// The same from the tensors: one walk of `outputs` with an index over `params`. Each tensor may
// appear in `params` only once: deduplicate tied weights by TensorImpl first. Undefined outputs
// and outputs that do not require grad are skipped. The graph is only read, never consumed, so
// the caller can still run backward on it.
std::vector<size_t> predict_ready_order(const std::vector<at::Tensor>& outputs,
                                        const std::vector<at::Tensor>& params);

}  // namespace ddp::planner
