#include "ddp/io/tensor_parallel_state.hpp"

#include "ddp/tp/parallelize.hpp"

namespace ddp::io {
namespace {

// The parameter a key's tensor is split like, or "" when it is not split at all (a scalar).
std::string parameter_of(const std::string& key, const at::Tensor& t, StateKeys keys) {
  if (t.dim() == 0) return "";
  if (keys == StateKeys::kModel) return key;
  // Optimizer fields ("momentum_buffer", "exp_avg", ...) have no dots; parameter names do.
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(0, dot);
}

}  // namespace

TensorMap whole_tensors(const tp::TensorParallel& tp, const TensorMap& held, StateKeys keys) {
  TensorMap out;
  // TensorMap is ordered by key, so every tp rank gathers the same tensors in the same order.
  for (const auto& [key, t] : held) {
    const std::string param = parameter_of(key, t, keys);
    out[key] = param.empty() ? t.detach().clone() : tp.full(param, t);
  }
  return out;
}

TensorMap held_tensors(const tp::TensorParallel& tp, const TensorMap& whole, StateKeys keys) {
  TensorMap out;
  for (const auto& [key, t] : whole) {
    const std::string param = parameter_of(key, t, keys);
    out[key] = param.empty() ? t.detach().clone() : tp.local(param, t);
  }
  return out;
}

}  // namespace ddp::io
