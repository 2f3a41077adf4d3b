#include "ddp/io/tensor_parallel_state.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/layout_tensors.hpp"
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

// The layout `key`'s tensor is split by, or null when it is whole on every rank.
const layout::Layout* layout_of(const StateLayouts& layouts, const std::string& key,
                                const at::Tensor& t, StateKeys keys) {
  const std::string param = parameter_of(key, t, keys);
  if (param.empty()) return nullptr;
  const auto it = layouts.layouts.by_name.find(param);
  if (it == layouts.layouts.by_name.end() || it->second.placements.empty()) return nullptr;
  return &it->second;
}

}  // namespace

TensorMap whole_tensors(const StateLayouts& layouts, const TensorMap& held, StateKeys keys) {
  TORCH_CHECK(layouts.group, "ddp: checkpoint: StateLayouts::group is null");
  TensorMap out;
  // TensorMap is ordered by key, so every rank gathers the same tensors in the same order.
  for (const auto& [key, t] : held) {
    const layout::Layout* layout = layout_of(layouts, key, t, keys);
    if (layout == nullptr) {
      out[key] = t.detach().clone();
      continue;
    }
    const at::Tensor local =
        comm::real_local(*layout, t, layouts.layouts.coordinate, "checkpoint: '" + key + "'");
    out[key] = comm::gather_whole(*layout, local, *layouts.group, "checkpoint gather of " + key);
  }
  return out;
}

TensorMap held_tensors(const StateLayouts& layouts, const TensorMap& whole, StateKeys keys) {
  TensorMap out;
  for (const auto& [key, t] : whole) {
    const layout::Layout* layout = layout_of(layouts, key, t, keys);
    if (layout == nullptr) {
      out[key] = t.detach().clone();
      continue;
    }
    TORCH_CHECK(t.sizes().vec() == layout->shape, "ddp: checkpoint: '", key, "' has shape ",
                t.sizes(), " but this run's layout of it is ", layout::describe(*layout));
    out[key] =
        comm::padded_local(*layout, comm::take_local(*layout, t, layouts.layouts.coordinate));
  }
  return out;
}

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
