#pragma once
// Autocast state of one device type (kCUDA or kCPU), across the 2.4 API change that
// torch_compat.hpp names (DDP_AUTOCAST_PER_DEVICE_API). Beside torch_compat.hpp rather than in
// it: that header is included by every comm header, and <ATen/autocast_mode.h> is needed only by
// parallel::AutocastGuard and unit::activation_checkpoint (which recomputes under forward's state).

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::detail {

inline bool autocast_enabled(c10::DeviceType device) {
#if DDP_AUTOCAST_PER_DEVICE_API
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if DDP_AUTOCAST_PER_DEVICE_API
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                              : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_autocast(c10::DeviceType device, bool on, c10::ScalarType dtype) {
#if DDP_AUTOCAST_PER_DEVICE_API
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, on);
#else
  if (device == c10::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(on);
  }
#endif
}

}  // namespace ddp::detail
