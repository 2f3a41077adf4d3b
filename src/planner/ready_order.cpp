#include "ddp/planner/ready_order.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <queue>
#include <unordered_map>

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
// We replay exactly that: the same counts, the same push order and the same std::priority_queue
// with the same comparator, so even ties (several accumulators ready at once, all UINT64_MAX)
// pop in the engine's order. What it cannot see: a loss built on the outputs adds nodes above
// them, but those all have higher sequence numbers and depend only on each other, so they run
// before any node below the outputs and do not change the parameters' order. Parameters used
// only by the loss are unreachable here. Device queues (CUDA nodes run on a per-device thread)
// and reentrant backward (checkpointing) are outside the model.

namespace {

using torch::autograd::Node;

// CompareNodeTaskTime for tasks of one plain backward (reentrant depth 0, none empty or a
// shutdown task): true when t2 runs before t1.
struct RunsAfter {
  bool operator()(const Node* t1, const Node* t2) const {
    return t1->sequence_nr() < t2->sequence_nr();
  }
};

}  // namespace

std::vector<size_t> predict_ready_order(const std::vector<at::Tensor>& outputs,
                                        const std::vector<at::Tensor>& params) {
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  index_of.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK(params[i].defined(), "predict_ready_order: params[", i, "] is undefined");
    const auto [it, inserted] = index_of.emplace(params[i].unsafeGetTensorImpl(), i);
    TORCH_CHECK(inserted, "predict_ready_order: params[", i, "] is the same tensor as params[",
                it->second,
                "] (a tied weight?); pass each parameter once, deduplicated by TensorImpl");
  }

  // The root_edges Engine::execute would get for backward(outputs). A leaf's edge holds its grad
  // accumulator, which keeps a fresh one alive for the walk.
  std::vector<torch::autograd::Edge> roots;
  roots.reserve(outputs.size());
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad()) {
      roots.push_back(torch::autograd::impl::gradient_edge(out));
    }
  }

  // Incoming-edge count of every node reachable from the roots, counted from a GraphRoot over
  // `roots` (Engine::compute_dependencies). A node is in the map once some edge reached it, which
  // is the engine's `seen` set. Iterative: deep models would overflow a recursive walk.
  std::unordered_map<Node*, size_t> dependencies;
  std::vector<Node*> stack;
  auto count_edge = [&](const torch::autograd::Edge& edge) {
    if (Node* next = edge.function.get()) {
      if (dependencies[next]++ == 0) stack.push_back(next);
    }
  };
  for (const auto& edge : roots) count_edge(edge);
  while (!stack.empty()) {
    Node* fn = stack.back();
    stack.pop_back();
    for (const auto& edge : fn->next_edges()) count_edge(edge);
  }

  // Engine::evaluate_function's loop over next_edges, minus the gradients.
  std::priority_queue<Node*, std::vector<Node*>, RunsAfter> ready;
  auto release_edge = [&](const torch::autograd::Edge& edge) {
    Node* next = edge.function.get();
    if (next == nullptr) return;  // an input that needs no gradient
    const auto it = dependencies.find(next);
    TORCH_INTERNAL_ASSERT(it != dependencies.end(), "predict_ready_order: ", next->name(),
                          " was not counted");
    if (--it->second == 0) {
      dependencies.erase(it);
      ready.push(next);
    }
  };
  // The GraphRoot runs first and releases its edges in output order; with a single root the engine
  // queues that node directly, which is the same heap state.
  for (const auto& edge : roots) release_edge(edge);

  std::vector<size_t> order;
  while (!ready.empty()) {
    Node* fn = ready.top();
    ready.pop();
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(fn)) {
      const auto it = index_of.find(acc->variable.unsafeGetTensorImpl());
      if (it != index_of.end()) order.push_back(it->second);
    }
    for (const auto& edge : fn->next_edges()) release_edge(edge);
  }
  // Every reachable node ran: the graph is a DAG and each edge was released once.
  TORCH_INTERNAL_ASSERT(dependencies.empty(), "predict_ready_order: ", dependencies.size(),
                        " node(s) never became ready");
  return order;
}

}  // namespace ddp::planner
