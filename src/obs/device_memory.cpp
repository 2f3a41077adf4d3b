#include "ddp/obs/device_memory.hpp"

#include "ddp/detail/torch_compat.hpp"
#include "ddp/obs/cpu_memory.hpp"

#if DDP_HAVE_NCCL
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ddp::obs {

int64_t device_peak_allocated_bytes(const c10::Device& device) {
#if DDP_HAVE_NCCL
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    // Index 0 is StatType::AGGREGATE (all pools) in every version; the enum's namespace moved
    // between 1.13 and 2.x.
    return stats.allocated_bytes[0].peak;
  }
#endif
  if (device.is_cpu() && cpu_memory_counted()) return cpu_peak_allocated_bytes();
  return -1;
}

int64_t device_allocated_bytes(const c10::Device& device) {
#if DDP_HAVE_NCCL
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())
        .allocated_bytes[0]
        .current;
  }
#endif
  if (device.is_cpu() && cpu_memory_counted()) return cpu_allocated_bytes();
  return -1;
}

void reset_device_peak(const c10::Device& device) {
#if DDP_HAVE_NCCL
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  if (device.is_cpu()) reset_cpu_peak();
}

int64_t device_capacity_bytes(const c10::Device& device) {
#if DDP_HAVE_NCCL
  if (device.is_cuda()) {
    return static_cast<int64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  }
#endif
  (void)device;
  return -1;
}

std::string device_name(const c10::Device& device) {
#if DDP_HAVE_NCCL
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  (void)device;
  return "";
}

}  // namespace ddp::obs
