#pragma once
// Whether work issued now on `device` is being recorded into a CUDA graph: the one question the
// layers below graphs/ ask, so that what cannot be replayed (a host read of a device value, a
// collective on the host) is refused by name at the capture instead of failing with CUDA's
// "operation not permitted when stream is capturing". False on a CPU device and in a build without
// CUDA graphs (Debian's libtorch 1.13).

#include <c10/core/Device.h>

#include "ddp/detail/torch_compat.hpp"

#if DDP_HAVE_CUDA_GRAPHS
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ddp::detail {

inline bool is_capturing(const c10::Device& device) {
#if DDP_HAVE_CUDA_GRAPHS
  if (!device.is_cuda()) return false;
  // cudaStreamIsCapturing is one of the few calls legal during a capture in any mode.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)device;
  return false;
#endif
}

}  // namespace ddp::detail
