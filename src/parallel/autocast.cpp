#include "ddp/parallel/autocast.hpp"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::parallel {

namespace {

bool enabled(c10::DeviceType device) {
#if DDP_AUTOCAST_PER_DEVICE_API
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

c10::ScalarType dtype(c10::DeviceType device) {
#if DDP_AUTOCAST_PER_DEVICE_API
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                              : at::autocast::get_autocast_cpu_dtype();
#endif
}

void set(c10::DeviceType device, bool on, c10::ScalarType type) {
#if DDP_AUTOCAST_PER_DEVICE_API
  at::autocast::set_autocast_dtype(device, type);
  at::autocast::set_autocast_enabled(device, on);
#else
  if (device == c10::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(type);
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_autocast_cpu_dtype(type);
    at::autocast::set_cpu_enabled(on);
  }
#endif
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType type)
    : device_(device), was_enabled_(enabled(device)), previous_dtype_(dtype(device)) {
  TORCH_CHECK(device == c10::kCUDA || device == c10::kCPU,
              "ddp: autocast is supported on cuda and cpu, not ", device);
  TORCH_CHECK(type == c10::kBFloat16 || type == c10::kHalf,
              "ddp: autocast dtype must be bfloat16 or float16, got ", type);
  at::autocast::increment_nesting();
  set(device_, true, type);
}

AutocastGuard::~AutocastGuard() {
  set(device_, was_enabled_, previous_dtype_);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace ddp::parallel
