#pragma once
// The autograd graph behind a tensor as Graphviz DOT (the seed harness's --torchviz): backward
// nodes as ellipses, parameters (AccumulateGrad leaves) as boxes labelled with their names.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace ddp::obs {

std::string autograd_graph_dot(const at::Tensor& root, const std::vector<at::Tensor>& params,
                               const std::vector<std::string>& names);

}  // namespace ddp::obs
