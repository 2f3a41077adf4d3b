#pragma once
// Parameter tensor -> its index in the caller's parameter list, the one lookup every graph
// question ends in (an AccumulateGrad leaf's variable is a parameter, or an input that is not).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

namespace ddp::planner {

class ParamIndex {
 public:
  // Returned by find() for a tensor that is not one of the parameters.
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // Every parameter must be defined and appear once: a tied weight passed under two indices
  // would make "which index is ready / used" ambiguous. `caller` prefixes the error message so
  // that it names the API the user called.
  explicit ParamIndex(const std::vector<at::Tensor>& params, const char* caller = "ddp::planner");

  // params[i]'s index for the tensor that shares its TensorImpl, kNone otherwise.
  size_t find(const at::Tensor& tensor) const;

  size_t size() const { return index_of_.size(); }

 private:
  std::unordered_map<const c10::TensorImpl*, size_t> index_of_;  // filled once, never changed
};

}  // namespace ddp::planner
