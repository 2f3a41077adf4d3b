#include "ddp/planner/ready_order.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <queue>

namespace ddp::planner {

// [Note: simulating the ready queue]
// A CPU backward runs on the calling thread from one ready queue (torch/csrc/autograd/engine.cpp,
// the same in 1.13 and 2.x):
//  1. Engine::execute takes the roots' gradient edges; with several it makes a GraphRoot whose
//     next_edges are those edges, with one it queues that edge's node directly.
//  2. Engine::compute_dependencies walks everything reachable from the root and counts, for every
//     node, its incoming edges (one per edge, so a node fed twice by one node counts 2).
//  3. Engine::evaluate_function runs a node, then goes through its next_edges in order: each
//     valid edge decrements its node's count, and a node whose count reaches 0 is pushed.
//  4. The queue is a std::priority_queue ordered by ReadyQueue::CompareNodeTaskTime: higher
//     reentrant depth first, then higher Node::sequence_nr() first. Sequence numbers grow in
//     forward order, so the node of the latest forward op runs first; AccumulateGrad nodes are
//     built with sequence_nr UINT64_MAX (accumulate_grad.cpp), so a parameter's accumulator runs
//     as soon as it is ready.
// We replay exactly that over one AutogradGraph, whose walk counted as in step 2: the same counts,
// the same push order and the same std::priority_queue with the same comparator, so even ties
// (several accumulators ready at once, all UINT64_MAX) pop in the engine's order. What it cannot
// see: a loss built on the outputs adds nodes above them, but those all have higher sequence
// numbers and depend only on each other, so they run before any node below the outputs and do not
// change the parameters' order. Parameters used only by the loss are unreachable here. Device
// queues (CUDA nodes run on a per-device thread) and reentrant backward (checkpointing) are outside
// the model.

namespace {

using torch::autograd::Node;

// CompareNodeTaskTime for tasks of one plain backward (reentrant depth 0, none empty or a
// shutdown task), over node ids of one graph: true when t2 runs before t1.
struct RunsAfter {
  const std::vector<Node*>* nodes;
  bool operator()(size_t t1, size_t t2) const {
    return (*nodes)[t1]->sequence_nr() < (*nodes)[t2]->sequence_nr();
  }
};

}  // namespace

std::vector<size_t> predict_ready_order(const AutogradGraph& graph) {
  // The engine's per-node counts, consumed as edges are released (Engine::evaluate_function's
  // loop over next_edges, minus the gradients).
  std::vector<uint32_t> remaining = graph.dependencies();
  std::priority_queue<size_t, std::vector<size_t>, RunsAfter> ready(RunsAfter{&graph.nodes()});
  auto release_edge = [&](const torch::autograd::Edge& edge) {
    Node* next = edge.function.get();
    if (next == nullptr) return;  // an input that needs no gradient
    const size_t id = graph.id_of(next);
    TORCH_INTERNAL_ASSERT(remaining[id] > 0, "predict_ready_order: ", next->name(),
                          " released more often than counted");
    if (--remaining[id] == 0) ready.push(id);
  };
  // The GraphRoot runs first and releases its edges in output order; with a single root the engine
  // queues that node directly, which is the same heap state.
  for (const auto& edge : graph.roots()) release_edge(edge);

  std::vector<size_t> order;
  size_t ran = 0;
  while (!ready.empty()) {
    const size_t id = ready.top();
    ready.pop();
    ++ran;
    if (graph.param_of()[id] != ParamIndex::kNone) order.push_back(graph.param_of()[id]);
    for (const auto& edge : graph.nodes()[id]->next_edges()) release_edge(edge);
  }
  // Every reachable node ran: the graph is a DAG and each edge was released once.
  TORCH_INTERNAL_ASSERT(ran == graph.size(), "predict_ready_order: ", graph.size() - ran,
                        " node(s) never became ready");
  return order;
}

std::vector<size_t> predict_ready_order(const std::vector<at::Tensor>& outputs,
                                        const std::vector<at::Tensor>& params) {
  return predict_ready_order(AutogradGraph(outputs, ParamIndex(params, "predict_ready_order")));
}

}  // namespace ddp::planner
