#include "ddp/planner/param_index.hpp"

#include <c10/util/Exception.h>

namespace ddp::planner {

ParamIndex::ParamIndex(const std::vector<at::Tensor>& params, const char* caller) {
  index_of_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK(params[i].defined(), caller, ": params[", i, "] is undefined");
    const auto [it, inserted] = index_of_.emplace(params[i].unsafeGetTensorImpl(), i);
    TORCH_CHECK(inserted, caller, ": params[", i, "] is the same tensor as params[", it->second,
                "] (a tied weight?); pass each parameter once, deduplicated by TensorImpl");
  }
}

size_t ParamIndex::find(const at::Tensor& tensor) const {
  const auto it = index_of_.find(tensor.unsafeGetTensorImpl());
  return it == index_of_.end() ? kNone : it->second;
}

}  // namespace ddp::planner
