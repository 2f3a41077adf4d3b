#pragma once
// The one place where libtorch version differences are handled. libddp builds against Debian's
// libtorch 1.13 (CPU, Gloo) and against the torch 2.x libtorch of the GPU machine (CUDA, NCCL,
// no Gloo headers). Nothing outside this file tests TORCH_VERSION_* or __has_include.

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#if __has_include(<gloo/algorithm.h>)
#define DDP_HAVE_GLOO 1
#else
#define DDP_HAVE_GLOO 0
#endif

#if defined(DDP_WITH_NCCL) && DDP_WITH_NCCL
#define DDP_HAVE_NCCL 1
#else
#define DDP_HAVE_NCCL 0
#endif

// CUDA graphs (at::cuda::CUDAGraph) come with every CUDA build of libtorch we build against, which
// is what DDP_WITH_NCCL detects; the CPU build has neither, and graphs/ refuses there.
#define DDP_HAVE_CUDA_GRAPHS DDP_HAVE_NCCL

// Autocast: 2.4 replaced the CUDA-only calls (set_enabled, set_autocast_gpu_dtype) by calls that
// take the device type (set_autocast_enabled, set_autocast_dtype); the old ones warn since.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DDP_AUTOCAST_PER_DEVICE_API 1
#else
#define DDP_AUTOCAST_PER_DEVICE_API 0
#endif

// Fused attention: at::scaled_dot_product_attention (flash / memory-efficient kernels on CUDA)
// exists since 2.0; 1.13 has only the private _scaled_dot_product_attention, so the zoo's GPT
// writes attention out there (models/src/causal_attention.cpp).
#if TORCH_VERSION_MAJOR >= 2
#define DDP_HAVE_SDPA 1
#else
#define DDP_HAVE_SDPA 0
#endif

// c10::Allocator (obs/cpu_memory.cpp's counting allocator): 2.3 made allocate() non-const and
// added the pure virtual copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DDP_ALLOCATOR_ALLOCATE_CONST
#define DDP_ALLOCATOR_HAS_COPY_DATA 1
#else
#define DDP_ALLOCATOR_ALLOCATE_CONST const
#define DDP_ALLOCATOR_HAS_COPY_DATA 0
#endif

// at::_chunk_cat (2.4+): chunks each tensor along a dim into N padded chunks and lays chunk k of
// every tensor side by side in row k of a (N, -1) output, in one kernel: FSDP2's reduce-scatter
// copy-in. Without it (1.13), a FULLY_SHARD unit copies each gradient into the layout in turn.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DDP_HAVE_CHUNK_CAT 1
#else
#define DDP_HAVE_CHUNK_CAT 0
#endif

// _foreach_mul_(TensorList, const Tensor&) (2.1+): scales many tensors by a device scalar in one
// kernel, as clip_grad_norm_ does on CUDA since 2.1; 1.13 has only the Scalar overloads.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define DDP_HAVE_FOREACH_TENSOR_SCALE 1
#else
#define DDP_HAVE_FOREACH_TENSOR_SCALE 0
#endif

// _fused_adam_ / _fused_adamw_ / _fused_sgd_ with a tensor learning rate and a found_inf flag
// (2.4+ for all three): one multi-tensor kernel per parameter group for the whole update, which
// skips itself on the device when found_inf is set (PyTorch's fused=True). 1.13 has none of them.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DDP_HAVE_FUSED_OPTIM 1
#else
#define DDP_HAVE_FUSED_OPTIM 0
#endif

// _foreach_copy_ (2.2+): copies many tensors in one multi-tensor kernel (a few launches for a
// whole bucket instead of one per gradient). 1.13 copies each in turn.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define DDP_HAVE_FOREACH_COPY 1
#else
#define DDP_HAVE_FOREACH_COPY 0
#endif

// torch::data samplers (data/): the Sampler base class returns and takes c10::optional, a type of
// its own in 1.13 and an alias of std::optional since 2.x, so overrides spell c10::optional and
// compile against both without a version test (the data headers do not include this file, to
// stay free of c10d).

namespace ddp::detail {

#if TORCH_VERSION_MAJOR >= 2
// Since 2.0 the concrete process groups (Gloo, NCCL) are c10d::Backend subclasses; the collectives
// we call (allreduce, broadcast, allgather, barrier) are virtual on Backend.
using CollectiveBackend = c10d::Backend;
#else
// In 1.13 ProcessGroupGloo derives from ProcessGroup directly.
using CollectiveBackend = c10d::ProcessGroup;
#endif

}  // namespace ddp::detail
