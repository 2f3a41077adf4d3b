#pragma once
// Peak device memory for reports (ddp-bench --verbose / --json): the CUDA caching allocator's peak
// of allocated bytes since the last reset. -1 where there is no such number (CPU tensors, or a
// libtorch without CUDA): CPU memory is reported as tensor storage bytes instead.

#include <c10/core/Device.h>

#include <cstdint>

namespace ddp::obs {

int64_t device_peak_allocated_bytes(const c10::Device& device);
void reset_device_peak(const c10::Device& device);

}  // namespace ddp::obs
