#include "ddp/planner/reachability.hpp"

namespace ddp::planner {

std::vector<bool> reachable_params(const AutogradGraph& graph) {
  std::vector<bool> reachable(graph.num_params(), false);
  for (const size_t param : graph.param_of()) {
    if (param != ParamIndex::kNone) reachable[param] = true;
  }
  return reachable;
}

std::vector<bool> reachable_params(const std::vector<at::Tensor>& outputs,
                                   const std::vector<at::Tensor>& params) {
  return reachable_params(AutogradGraph(outputs, ParamIndex(params, "reachable_params")));
}

}  // namespace ddp::planner
