#include "ddp/models/mlp.hpp"

#include <c10/util/Exception.h>

#include "ddp/unit/call_unit.hpp"

namespace ddp::models {

MLPImpl::MLPImpl(const MLPOptions& options_) : options(options_) {
  TORCH_CHECK(options.depth >= 1, "MLP: depth must be at least 1, got ", options.depth);
  TORCH_CHECK(options.in > 0 && options.hidden > 0 && options.out > 0,
              "MLP: in, hidden and out must be positive, got in=", options.in,
              " hidden=", options.hidden, " out=", options.out);
  layers = register_module("layers", torch::nn::Sequential());
  for (int64_t i = 0; i < options.depth; ++i) {
    const int64_t fan_in = i == 0 ? options.in : options.hidden;
    const int64_t fan_out = i == options.depth - 1 ? options.out : options.hidden;
    linears_.emplace_back(fan_in, fan_out);
    layers->push_back(linears_.back());
  }
}

torch::Tensor MLPImpl::forward(torch::Tensor x) {
  for (size_t i = 0; i < linears_.size(); ++i) {
    x = unit::call_unit(*linears_[i], x, checkpoint_units);
    if (i + 1 < linears_.size()) x = torch::relu(x);
  }
  return x;
}

}  // namespace ddp::models
