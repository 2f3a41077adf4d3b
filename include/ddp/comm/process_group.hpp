#pragma once
// ddp::comm::ProcessGroup: the collectives libddp needs, over a c10d backend (Gloo or NCCL), with
// one timeout for all of them. Every wait is bounded: a dead or hung rank becomes an error that
// names the collective and the timeout, never a hang.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::comm {

class ProcessGroup {
 public:
  // `backend` is the concrete c10d process group; `store` is the rendezvous store it was made
  // with (kept for out-of-band exchange such as the replica check).
  ProcessGroup(c10::intrusive_ptr<detail::CollectiveBackend> backend,
               c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
               std::string backend_name, std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& backend_name() const { return backend_name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  c10d::Store& store() { return *store_; }

  // Whether the backend can sum tensors of `dtype` (Gloo in libtorch 1.13 has no bfloat16 sum).
  bool can_sum(at::ScalarType dtype) const;

  // Asynchronous in-place sum over all ranks. Collectives must be issued in the same order on every
  // rank; the caller keeps that order.
  c10::intrusive_ptr<c10d::Work> allreduce_sum_async(at::Tensor& tensor);

  // Blocking forms; each waits at most timeout() and names `what` in its error.
  void allreduce_sum(at::Tensor& tensor, const std::string& what);
  void broadcast(at::Tensor& tensor, int root, const std::string& what);
  std::vector<at::Tensor> allgather(const at::Tensor& tensor, const std::string& what);
  void barrier(const std::string& what);

  // Waits for `work` at most timeout(); rethrows its failure with `what` and the timeout named.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;

  // Unique per-process counter for store keys, so that repeated exchanges do not collide.
  int64_t next_exchange_id() { return exchange_id_++; }

 private:
  c10::intrusive_ptr<detail::CollectiveBackend> backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int world_size_;
  std::string backend_name_;
  std::chrono::milliseconds timeout_;
  int64_t exchange_id_ = 0;  // advances identically on every rank: exchanges are collective
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace ddp::comm
