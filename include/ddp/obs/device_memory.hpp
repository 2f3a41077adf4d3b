#pragma once
// Peak device memory and the device's name for reports (ddp-bench --verbose / --json): the CUDA
// caching allocator's peak of allocated bytes since the last reset. -1 where there is no such
// number: CPU tensors unless obs::count_cpu_memory() counts them (then its counts), or a libtorch
// without CUDA.

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace ddp::obs {

int64_t device_peak_allocated_bytes(const c10::Device& device);
// The bytes the caching allocator has handed out now (its current, not its peak); -1 as above.
int64_t device_allocated_bytes(const c10::Device& device);
void reset_device_peak(const c10::Device& device);

// The device's memory in bytes (CUDA: its total global memory), for the refusal of a style that
// cannot fit (parallel/memory_estimate.hpp); -1 for the CPU or a build without CUDA.
int64_t device_capacity_bytes(const c10::Device& device);

// The device's marketing name ("NVIDIA H100 80GB HBM3"), for a table of peak FLOP/s; "" for the
// CPU or a build without CUDA.
std::string device_name(const c10::Device& device);

}  // namespace ddp::obs
