#include "ddp/models/net.hpp"

#include <c10/util/Exception.h>

#include "ddp/unit/call_unit.hpp"

namespace ddp::models {

NetImpl::NetImpl(int64_t dim) {
  TORCH_CHECK(dim > 0, "Net: dim must be positive, got ", dim);
  // Registration order is the parameter order that bucket assignment sees; keep fc1..fc4.
  fc1 = register_module("fc1", torch::nn::Linear(dim, dim));
  fc2 = register_module("fc2", torch::nn::Linear(dim, dim));
  fc3 = register_module("fc3", torch::nn::Linear(dim, dim));
  fc4 = register_module("fc4", torch::nn::Linear(dim, dim));
}

torch::Tensor NetImpl::forward(const torch::Tensor& x) {
  torch::Tensor out = x;
  for (torch::nn::Linear* fc : {&fc1, &fc2, &fc3, &fc4}) {
    out = unit::call_unit(**fc, out, checkpoint_units);
  }
  return out;
}

}  // namespace ddp::models
