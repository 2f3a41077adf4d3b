#pragma once
// AutocastGuard: what `with torch.autocast(device_type, dtype):` does in Python, for a scope of
// C++ code. Put the forward and the loss inside it, the backward outside (backward runs each op in
// the dtype its forward chose).

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace ddp::parallel {

class AutocastGuard {
 public:
  // `device`: kCUDA or kCPU; `dtype`: the lower precision (kBFloat16 or kHalf).
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype);
  // Restores the previous state; the outermost guard also empties the cache of casted weights, so
  // the next forward casts the updated parameters again (as Python's autocast exit does).
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType previous_dtype_;
};

}  // namespace ddp::parallel
