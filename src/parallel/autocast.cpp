#include "ddp/parallel/autocast.hpp"

#include <c10/util/Exception.h>

#include "ddp/detail/autocast_compat.hpp"

namespace ddp::parallel {

using detail::autocast_dtype;
using detail::autocast_enabled;
using detail::set_autocast;

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType type)
    : device_(device),
      was_enabled_(autocast_enabled(device)),
      previous_dtype_(autocast_dtype(device)) {
  TORCH_CHECK(device == c10::kCUDA || device == c10::kCPU,
              "ddp: autocast is supported on cuda and cpu, not ", device);
  TORCH_CHECK(type == c10::kBFloat16 || type == c10::kHalf,
              "ddp: autocast dtype must be bfloat16 or float16, got ", type);
  at::autocast::increment_nesting();
  set_autocast(device_, true, type);
}

AutocastGuard::~AutocastGuard() {
  set_autocast(device_, was_enabled_, previous_dtype_);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace ddp::parallel
