#pragma once
// ddp::comm::ProcessGroup: the collectives libddp needs, over a c10d backend (Gloo or NCCL), with
// one timeout for all of them. Every wait is bounded: a dead or hung rank becomes an error that
// names the collective and the timeout, never a hang.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/collective_progress.hpp"
#include "ddp/detail/torch_compat.hpp"

namespace ddp::comm {

class ProcessGroup {
 public:
  // `backend` is the concrete c10d process group; `store` is the rendezvous store it was made
  // with (kept for out-of-band exchange such as the replica check).
  // `progress_store`: a separate connection to the store for the desync heartbeat (see
  // [Note: sequence numbers]); null: no heartbeat, errors still compare what the ranks published.
  ProcessGroup(c10::intrusive_ptr<detail::CollectiveBackend> backend,
               c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
               std::string backend_name, std::chrono::milliseconds timeout,
               c10::intrusive_ptr<c10d::Store> progress_store = {});
  // Runs the shutdown set by init (NCCL: flushes and destroys the communicators and stops their
  // watchdog, what destroy_process_group does in Python), so a process exits without warnings.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

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
  // Asynchronous in-place average. NCCL divides inside the reduction (ncclAvg: each input is
  // pre-multiplied by 1/world size, so no separate pass over the tensor and no overflow of low
  // precision sums); other backends divide first, then sum.
  c10::intrusive_ptr<c10d::Work> allreduce_avg_async(at::Tensor& tensor);
  // Whether the average is done inside the collective (NCCL).
  bool reduces_avg() const { return backend_name_ == "nccl"; }

  // Blocking forms; each waits at most timeout() and names `what` in its error.
  void allreduce_sum(at::Tensor& tensor, const std::string& what);
  void broadcast(at::Tensor& tensor, int root, const std::string& what);
  std::vector<at::Tensor> allgather(const at::Tensor& tensor, const std::string& what);
  void barrier(const std::string& what);

  // Waits for `work` at most timeout(); rethrows its failure with `what` and the timeout named.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;
  // Orders what the caller runs next after `work`, blocking the host as little as the backend
  // allows. NCCL: the caller's current CUDA stream waits on the collective's end event and the host
  // goes on at once (a bounded host wait there would be a device synchronization per bucket); the
  // timeout is enforced by NCCL's watchdog, which ends the process naming the collective. Gloo: the
  // bounded host wait of wait().
  void wait_on_stream(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;

  // Called once by the destructor (init sets it for NCCL).
  void set_shutdown(std::function<void()> shutdown) { shutdown_ = std::move(shutdown); }

  // Desync detection (see [Note: sequence numbers]): who is behind, for an error about the
  // newest collective (a comm hook's future timed out).
  std::string progress_report() const { return progress_->report(nullptr); }

  // Unique per-process counter for store keys, so that repeated exchanges do not collide.
  int64_t next_exchange_id() { return exchange_id_++; }

 private:
  c10::intrusive_ptr<detail::CollectiveBackend> backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int world_size_;
  std::string backend_name_;
  std::chrono::milliseconds timeout_;
  int64_t exchange_id_ = 0;         // advances identically on every rank: exchanges are collective
  std::function<void()> shutdown_;  // empty: nothing to shut down (Gloo)
  // Numbers every collective and publishes this rank's count (heartbeat); never null.
  std::unique_ptr<CollectiveProgress> progress_;
  c10::intrusive_ptr<c10d::Work> issued(c10::intrusive_ptr<c10d::Work> work,
                                        const CollectiveOp& op);
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace ddp::comm
