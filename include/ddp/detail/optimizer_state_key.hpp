#pragma once
// [Note: optimizer state keys] libtorch keys Optimizer::state() by parameter identity: 1.13 by
// the string c10::guts::to_string(TensorImpl*) (an ostream's rendering of the pointer), 2.x by the
// TensorImpl* itself. Choosing by the map's key_type compiles against both without testing the
// torch version, which stays in ddp/detail/torch_compat.hpp.

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace ddp::detail {

using OptimizerStateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

// The key of `param`'s entry in an optimizer's state(). A template so that `if constexpr` discards
// the branch of the other torch version (it would not compile).
template <typename Map = OptimizerStateMap>
typename Map::key_type optimizer_state_key(const at::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace ddp::detail
