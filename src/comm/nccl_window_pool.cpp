#include "ddp/comm/nccl_window_pool.hpp"

#include <c10/util/Exception.h>

#include <thread>

#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

// Compiled only where ProcessGroupNCCL has registerMemPool (CMakeLists.txt: DDP_NCCL_HAS_MEM_POOL).

namespace ddp::comm {

struct NcclWindowPool::State {
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
  std::unique_ptr<at::cuda::MemPool> pool;  // made at the first allocation
};

NcclWindowPool::NcclWindowPool(c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl)
    : state_(std::make_unique<State>()) {
  state_->nccl = std::move(nccl);
}

at::Tensor NcclWindowPool::empty(int64_t numel, const at::TensorOptions& options) {
  TORCH_CHECK(options.device().is_cuda() && options.device().has_index(),
              "ddp: NcclWindowPool: registered memory lies on one CUDA device, not ",
              options.device());
  State& s = *state_;
  if (!s.pool) {
    auto allocator = std::static_pointer_cast<c10::cuda::CUDACachingAllocator::CUDAAllocator>(
        s.nccl->getMemAllocator());
    s.pool = std::make_unique<at::cuda::MemPool>(std::move(allocator));
  }
  // Only this thread's allocations go to the pool while it allocates (autograd's device thread
  // may be allocating beside it).
  const auto thread = std::this_thread::get_id();
  const c10::DeviceIndex device = options.device().index();
  c10::cuda::CUDACachingAllocator::beginAllocateToPool(
      device, s.pool->id(),
      [thread](cudaStream_t) { return std::this_thread::get_id() == thread; });
  at::Tensor tensor;
  try {
    tensor = at::empty({numel}, options);
  } catch (...) {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, s.pool->id());
    throw;
  }
  c10::cuda::CUDACachingAllocator::endAllocateToPool(device, s.pool->id());
  // Registers the segments not registered yet (c10d skips those that are): the same new segment
  // on every rank, as every rank made the same allocation.
  s.nccl->registerMemPool(s.pool.get(), /*symm=*/true);
  return tensor;
}

NcclWindowPool::~NcclWindowPool() = default;

}  // namespace ddp::comm
