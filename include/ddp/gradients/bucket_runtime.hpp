#pragma once
// BucketRuntime: executes one bucket plan's communication. It keeps the one ready counter per
// bucket, launches a bucket's reduction (all-reduce or reduce-scatter, as the bucket's plan entry
// says) the moment its last gradient is ready (strictly in plan order, so every rank issues the
// same collectives in the same order), and finishes them in that order. It owns no parameters and
// no autograd state: its bucket group (ReplicaBuckets, UnitBuckets) tells it what is ready and
// writes the results back.
//
// The gradient's path, one synchronized backward:
//
//   bucket group (grad in its storage) -> register_grad_ready(p) --pending[b] hits 0--> launch(b)
//   in plan order -> in_flight_ (FIFO of launched, unfinished buckets) -> finish_next(): bounded
//   wait (or a stream dependency on NCCL), hook result copied into the bucket (reduce-scatter:
//   returned as the shard) -> the group writes back and tells the listeners
//
// Host-side work on the hot path, per gradient: one counter decrement (under the
// GradientRuntime's mutex). Per bucket: one c10d call (or one comm-hook call), one small
// heap node in in_flight_, and on the CPU a future callback that takes a host timestamp (stats
// only; skipped on CUDA). At finish on Gloo, a bounded host wait; on NCCL, Work::wait() with no
// timeout, which only makes the current stream wait on the collective's end event. A CUDA-graph
// capture will have to do without the timestamp callback, the host wait and the heap nodes (a fixed
// ring would do).
//
// [Note: in-place reduction] With zero_grad(set_to_none) (PyTorch's default) every gradient
// arrives in a tensor autograd just made, not in the bucket. Filling the bucket copies them all on
// the compute stream (gpt2-medium: 43 multi-tensor copies, ~1.1 ms of a 60 ms step on H200s, at
// every world size), and the buckets keep a second, flat copy of every gradient for the whole run.
// Where the bucket group allows it (GradientOptions::reduce_in_place) and the bucket uses the
// built-in average, a bucket whose every gradient arrived that way is reduced where they are
// instead: one grouped all-reduce over the tensors (BucketBuffers::take_whole_staged), nothing
// copied, param.grad left pointing at them (Finished::in_place). A bucket with any gradient already
// in its storage (a bucket view, a zero for an unused parameter) is filled and reduced flat, as
// before. The flat storage of a bucket that is always reduced in place is never allocated
// (BucketStorage), so the gradients exist once in memory, as without DDP.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_buffers.hpp"
#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::gradients {

class BucketRuntime {
 public:
  // `params`, `plan` and `buffers` must outlive the runtime (the bucket groups of the
  // GradientRuntime own them and replace the plan, buffers and runtime together when the plan
  // changes). `params` are what a comm hook sees as GradBucket::params (hooks key their state by
  // them). Each bucket is reduced as its plan entry says (Bucket::reduction). A bucket's buffers
  // are read when it launches. `hook`: null for the built-in average. `first_index`: bucket b is
  // GradBucket::index first_index + b (the GradientRuntime numbers its groups' buckets in one
  // sequence, so that a hook keying state by index sees each bucket once).
  BucketRuntime(const std::vector<at::Tensor>& params, const buckets::BucketPlan& plan,
                buckets::BucketBuffers& buffers, comm::ProcessGroupPtr pg, hooks::CommHookPtr hook,
                int64_t plan_epoch, size_t first_index = 0);
  BucketRuntime(const BucketRuntime&) = delete;
  BucketRuntime& operator=(const BucketRuntime&) = delete;

  // Begins a synchronized backward: every bucket waits for all its gradients again.
  // `iteration`: synchronized backwards completed before this one (GradBucket::iteration).
  // `divisor`: what the average divides by; 0: the group size (join passes fewer ranks).
  void arm_synchronized(int64_t iteration, int64_t divisor);
  // Begins a local backward (no_sync): the counters are armed, but nothing launches (a group that
  // must know when a bucket's last gradient arrived still reads pending()).
  void arm_local();

  // A sparse parameter's gradient for this iteration (a sparse bucket holds no flat storage).
  void set_sparse_grad(size_t bucket, at::Tensor grad) {
    buckets_[bucket].sparse = std::move(grad);
  }

  // Parameter p's gradient is final and in its slot. Launches every bucket that is now complete
  // and whose predecessors are launched. Returns how many were launched: they are
  // [launched() - n, launched()).
  size_t register_grad_ready(size_t param);
  // Gradients bucket b still waits for in this backward.
  size_t pending(size_t bucket) const { return buckets_[bucket].pending; }
  size_t launched() const { return next_launch_; }

  // The oldest launched bucket not yet finished; false when none is in flight.
  bool has_in_flight() const { return !in_flight_.empty(); }
  // Whether that bucket's reduction already completed (no wait needed). A CUDA hook future
  // completes when enqueued, so it never counts as completed here (finished at the end instead).
  bool next_completed() const;

  struct Finished {
    size_t bucket = 0;
    at::Tensor sparse_result;   // sparse bucket: the reduced gradient
    at::Tensor shard;           // Reduction::kReduceScatter: this rank's row of the average
    bool in_place = false;      // reduced in the gradients' own tensors, not the storage
    int64_t comm_done_ns = -1;  // see BucketFinished::comm_done_ns
  };
  // Waits (bounded by the group's timeout) for the oldest in-flight bucket, puts a comm hook's
  // result into the bucket's storage (kReduceScatter: into Finished::shard), and returns it. Errors
  // name the bucket and, for a timeout, which rank is behind.
  Finished finish_next();

  // Drops whatever is in flight without waiting (after an error, or at the end of an iteration).
  void reset();

  // Join: issues the collectives a synchronized backward would, over zeros, and waits for them.
  void shadow_sync(int64_t iteration);

 private:
  struct BucketState {
    size_t pending = 0;  // gradients not yet ready this iteration; launch when it reaches 0
    at::Tensor sparse;   // sparse bucket: this iteration's (coalesced) gradient
    c10::intrusive_ptr<c10d::Work> work;             // built-in or sparse reduction
    c10::intrusive_ptr<c10::ivalue::Future> future;  // comm-hook reduction
    comm::PendingCollective scatter;                 // Reduction::kReduceScatter
    bool in_place = false;  // this iteration's reduction runs on the gradients' own tensors
    // When the reduction completed (from the comm thread's callback); stats only.
    std::shared_ptr<std::atomic<int64_t>> comm_done_ns;
  };

  // Every bucket waits for all its gradients again; `local`: nothing will launch.
  void arm(bool local);
  void launch(size_t bucket);
  void watch_completion(size_t bucket, const c10::intrusive_ptr<c10::ivalue::Future>& future);
  hooks::GradBucket grad_bucket(size_t bucket) const;
  std::string describe(size_t bucket) const;
  // The words for bucket b's reduction in a wait's error, made once per plan: a wait takes them by
  // reference, so no string is built per bucket per iteration.
  const std::string& what(size_t bucket) const { return what_[bucket]; }

  const std::vector<at::Tensor>& params_;
  const buckets::BucketPlan& plan_;
  buckets::BucketBuffers& buffers_;  // filled (BucketBuffers::fill) at each bucket's launch
  comm::ProcessGroupPtr pg_;
  hooks::CommHookPtr hook_;
  int64_t plan_epoch_;
  size_t first_index_;      // GradBucket::index of bucket 0
  bool on_device_ = false;  // CUDA buckets: waits are stream dependencies, no host timestamps
  std::vector<BucketState> buckets_;
  std::vector<std::string> what_;  // describe(b), per bucket
  int64_t iteration_ = 0;
  int64_t divisor_ = 0;           // this iteration's; 0: the group size
  bool local_ = false;            // this backward only counts (arm_local)
  size_t next_launch_ = 0;        // buckets [0, next_launch_) are launched this iteration
  std::deque<size_t> in_flight_;  // launched, not yet finished, in launch order
};

// The tensor a completed hook or c10d future holds (a tensor, or the first of a list).
at::Tensor future_tensor(const c10::intrusive_ptr<c10::ivalue::Future>& future);

// Waits for `future` at most `timeout`; rethrows its error or names `what` and the timeout, and
// with `pg` which rank is behind (see [Note: sequence numbers]).
void wait_future(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                 std::chrono::milliseconds timeout, const std::string& what,
                 const comm::ProcessGroup* pg = nullptr);

}  // namespace ddp::gradients
