#pragma once
// The counter of a CUDA generator inside a graph capture. While a stream captures, a CUDA
// generator's state cannot be read or set (libtorch asserts it is not capturing): its kernels take
// their Philox offset from the graph at each replay, plus an offset within the graph that the
// generator counts up at capture. That counter is what can be read: whether it moved over a span
// of capture says whether the span drew random numbers. Empty outside a capture, for a generator
// that is not CUDA's, and in a build without CUDA graphs (Debian's libtorch 1.13).

#include <ATen/core/Generator.h>

#include <cstdint>
#include <mutex>
#include <optional>

#include "ddp/detail/capture_status.hpp"

#if DDP_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace ddp::detail {

inline std::optional<uint64_t> capture_rng_offset(const at::Generator& generator) {
#if DDP_HAVE_CUDA_GRAPHS
  if (!generator.device().is_cuda() || !is_capturing(generator.device())) return std::nullopt;
  auto* cuda = at::check_generator<at::CUDAGeneratorImpl>(generator);
  std::lock_guard<std::mutex> lock(cuda->mutex_);
  // An increment of 0 moves nothing and returns where the next draw would start in the graph.
  return cuda->philox_cuda_state(0).offset_intragraph_;
#else
  (void)generator;
  return std::nullopt;
#endif
}

}  // namespace ddp::detail
