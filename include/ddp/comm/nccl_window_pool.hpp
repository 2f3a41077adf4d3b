#pragma once
// NcclWindowPool: memory for one NCCL group's collectives, allocated by NCCL (ncclMemAlloc, through
// ProcessGroupNCCL's allocator) into a private c10::cuda::MemPool whose segments are registered
// with the group's communicator as symmetric windows (ProcessGroupNCCL::registerMemPool, symm =
// true). Internal to comm/: made by the NCCL backend factory (init.cpp) when
// NcclOptions::register_buffers asks for it, used through ProcessGroup::empty_registered. Built
// only where ProcessGroupNCCL has memory pools (DDP_NCCL_HAS_MEM_POOL, read off its header at
// configure time).
//
// Why: NCCL >= 2.28 runs an all-gather on the GPU's copy engines, with no CTA taken from the
// compute beside it, only when both of its buffers lie in symmetric windows and the communicator's
// CTA policy is zero (NcclOptions::cta_policy 2); on other buffers it runs its kernels as before.
// Window registration is collective: every rank of the group must allocate the same sizes in the
// same order (the sharded units' buffers are: the same model on every rank), so that each new
// segment is registered by all of them, at the same offsets.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>

namespace c10d {
class ProcessGroupNCCL;
}

namespace ddp::comm {

class NcclWindowPool {
 public:
  // `nccl`: the group's backend. Its windows go with its communicator (NCCL releases them when
  // the communicator is destroyed or aborted), so the pool never deregisters them: a collective
  // deregistration at shutdown would hang a rank whose peers died.
  explicit NcclWindowPool(c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl);
  ~NcclWindowPool();
  NcclWindowPool(const NcclWindowPool&) = delete;
  NcclWindowPool& operator=(const NcclWindowPool&) = delete;

  // `numel` elements of `options` (a CUDA device: the group's) in the pool, every segment of which
  // is registered (a new one collectively, on every rank). The communicator must exist: the group
  // ran a collective before (a wrapper's first, the parameters' broadcast or checksum, does).
  at::Tensor empty(int64_t numel, const at::TensorOptions& options);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ddp::comm
