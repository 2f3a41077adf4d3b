#pragma once
// Reducer: averages gradients over all ranks while backward is still running.
//
// Invariants (see ../shared/DESIGN.md):
//  - Equivalence: after a synchronized backward, every parameter's grad equals the average over
//    ranks of the local gradients (for a batch-mean loss: the gradient of the global batch).
//  - Buckets are launched strictly in plan order, the same on every rank (collectives must match),
//    and a bucket is launched the moment its last gradient is ready, never earlier.
//  - backward() does not return before every bucket has completed and been written back: the
//    engine callback queued by the first ready gradient waits for them.
//  - The plan changes at most at two points, both collective: the first forward (graph planning)
//    or the end of the first synchronized backward (rebuild from rank 0's observed order).
//
// Timeline of one synchronized step (two buckets, b0 holds the last layer):
//
//   forward ........ | backward: grads fc4 fc3 | fc2 fc1 | callback: finish b0, b1
//   comm                     allreduce(b0) --->|allreduce(b1) --->|
//                            ^ b0 full              ^ b1 full
//   finish = wait, write the averaged gradients back, run the per-parameter optimizer (overlap)
//
// [Note: streams] On CUDA the reducer launches no kernel of its own on a side stream and never
// synchronizes the device. Gradients are copied into their bucket on the stream that produced them
// (the autograd engine's current stream for the device). ProcessGroupNCCL runs each all-reduce on
// its own communication stream after an event recorded on that compute stream, so the reduction
// starts when the bucket's last gradient is written, while the compute stream goes on with the
// rest of backward. finish() makes the compute stream wait on the all-reduce's end event
// (ProcessGroup::wait_on_stream), at the end of backward or, with the optimizer in backward, only
// for buckets whose event has already fired (Work::isCompleted polls it): compute never waits on
// communication it does not consume.
//
//   compute  |bwd fc4|copy|bwd fc3..fc2|copy|bwd fc1|copy|   wait(e0) wait(e1) wait(e2)|optimizer
//   nccl            \__allreduce b0__/   \__allreduce b1__/  \__ b2 __/
//                   ^ event: b0 written   (each all-reduce records an end event e_b)

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/reducer/reducer_options.hpp"
#include "ddp/reducer/timeline.hpp"

namespace torch::optim {
class Optimizer;
}
namespace torch::autograd {
struct Node;
}

namespace ddp::reducer {

// Makes the optimizer that owns one parameter when the optimizer runs inside backward.
using ParamOptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const at::Tensor& param)>;

class Reducer {
 public:
  // `params` are the distinct parameters that require grad, in registration order; `names` their
  // qualified names. The reducer installs a post-hook on each parameter's gradient accumulator.
  // `expect_sparse[i]`: parameter i produces sparse gradients (Embedding with sparse=true); it gets
  // a bucket of its own and is reduced as sparse. Empty: none.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          comm::ProcessGroupPtr process_group, ReducerOptions options,
          std::vector<bool> expect_sparse = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Replaces the built-in average. Once, before the first backward.
  void register_comm_hook(hooks::CommHookPtr hook);
  // Runs an optimizer step for each parameter as soon as its bucket is reduced, inside backward.
  // Once, before the first backward; the caller then must not step its own optimizer.
  void set_optimizer_in_backward(const ParamOptimizerFactory& factory);

  // End of a forward whose backward must be synchronized. `outputs` are the forward's outputs; with
  // find_unused_parameters (or static_graph's first iteration) the graph behind them decides which
  // parameters count as unused; at the first forward they give the predicted bucket order.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  // Graph planning (planner/): the gradient-ready order predicted at the first forward, before
  // prepare_for_backward. Rank 0's prediction is broadcast; the plan is rebuilt if it differs, and
  // no rebuild happens after iteration 1. Unlisted parameters go last.
  void set_predicted_order(const std::vector<size_t>& predicted);
  // True until the first forward has settled the plan (prediction or reverse order).
  bool awaiting_plan() const { return !planned_; }
  // End of a forward under no_sync: its backward only accumulates gradients locally.
  void prepare_for_local_backward();
  // Join: the average of this iteration divides by `divisor` instead of the world size (the
  // number of ranks still training). Built-in average only; reset after each backward.
  void set_divisor_for_next_backward(int64_t divisor);
  // Join: a rank out of data issues the same collectives as a synchronized backward, with zero
  // gradients, so the ranks still training are not left waiting.
  void shadow_backward();

  const buckets::BucketPlan& plan() const { return plan_; }
  const std::vector<buckets::ParamSpec>& param_specs() const { return specs_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  const ReducerOptions& options() const { return options_; }
  std::string comm_hook_name() const;
  // The flat buffer of dense bucket b (tests check views alias it).
  const at::Tensor& bucket_buffer(size_t b) const { return buckets_[b].buffer; }
  // Copy of the last synchronized backward's timeline.
  IterationTimeline last_timeline() const;
  // Synchronized backward passes completed so far.
  int64_t num_synchronized_backwards() const { return num_sync_backwards_; }
  // How often the plan changed (graph planning or rebuild), and the order it was built from.
  int64_t num_plan_changes() const { return num_plan_changes_; }
  // Called with the new table whenever the plan changes (rank 0 prints it when verbose).
  void on_plan_change(std::function<void(const std::string& table)> callback);

 private:
  // Life cycle of one iteration; checked at every transition, named in errors.
  enum class State {
    kIdle,           // no forward since the last backward: a backward now is an error
    kPreparedSync,   // forward done, its backward will be synchronized
    kPreparedLocal,  // forward done under no_sync: backward accumulates locally
    kBackwardSync,   // first gradient seen; finalize callback queued
    kBackwardLocal,  // first gradient seen under no_sync; reset callback queued
  };
  static const char* state_name(State s);

  struct BucketState {
    at::Tensor buffer;   // dense: flat gradients, allocated once per plan, never per step
    at::Tensor sparse;   // sparse bucket: this iteration's (coalesced) gradient
    size_t pending = 0;  // gradients not yet ready this iteration; launch when it reaches 0
    c10::intrusive_ptr<c10d::Work> work;             // built-in or sparse reduction
    c10::intrusive_ptr<c10::ivalue::Future> future;  // comm-hook reduction
    bool finished = false;                           // written back this iteration
    // When the reduction itself completed (set from the comm thread's callback); stats only.
    std::shared_ptr<std::atomic<int64_t>> comm_done_ns;
  };

  friend class GradReadyHook;
  void on_grad_ready(size_t index);  // from the accumulator post-hook, on the autograd thread
  void begin_sync_backward();
  void mark_ready(size_t index, bool used);
  void launch_ready_buckets();
  void launch(size_t bucket);
  void watch_completion(size_t bucket, const c10::intrusive_ptr<c10::ivalue::Future>& future);
  bool bucket_completed(size_t bucket) const;
  void finish_completed_buckets();  // in order, those already done: early write-back (+ optimizer)
  void finish(size_t bucket);       // waits (bounded), writes back, steps optimizers
  void wait_used_map();
  void finalize_backward();  // the end-of-backward engine callback
  void reset_iteration();
  void build_plan(const std::vector<size_t>& order);
  std::vector<size_t> agree_on_order(std::vector<size_t> order, const std::string& what);
  std::vector<size_t> complete_order(const std::vector<size_t>& partial) const;
  hooks::GradBucket grad_bucket(size_t b);
  int64_t now_ns() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<buckets::ParamSpec> specs_;
  comm::ProcessGroupPtr pg_;
  ReducerOptions options_;
  buckets::BucketPlan plan_;
  std::vector<size_t> plan_order_;  // the order plan_ was built from
  std::vector<BucketState> buckets_;
  // slots_[p]: parameter p's place in its bucket buffer, shaped like the parameter. Made with
  // set_() rather than view ops so it is not an autograd view (Optimizer::zero_grad's detach_
  // accepts it). Undefined for sparse parameters.
  std::vector<at::Tensor> slots_;
  hooks::CommHookPtr hook_;  // null: the built-in average
  std::vector<std::unique_ptr<torch::optim::Optimizer>> param_optimizers_;  // empty: no overlap
  std::function<void(const std::string&)> plan_callback_;

  // Hooks: the accumulator nodes are kept alive so the keys stay valid for removal.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  // The parameters live on a CUDA device: collectives are ordered with streams (see
  // [Note: streams]), and host waits are avoided on the hot path.
  bool on_device_ = false;
  mutable std::mutex mutex_;  // hooks and the callback may run on autograd worker threads
  State state_ = State::kIdle;
  bool planned_ = false;                // graph planning or reverse order has been settled
  bool rebuilt_ = false;                // the post-iteration-1 rebuild is done (or not needed)
  std::vector<size_t> observed_order_;  // this iteration's ready order (for the rebuild)
  std::vector<bool> ready_;             // per parameter, this iteration; reset at finalize
  std::vector<bool> reachable_;         // from this forward's outputs (all true without the walk)
  // static_graph: the parameters unused in the first iteration, and whether they were used on
  // some rank (the first iteration's all-reduced map).
  std::vector<bool> static_unused_;
  std::vector<bool> static_globally_used_;
  // Per parameter: had a gradient from any backward since the last synchronized one (no_sync steps
  // included). All-reduced to decide which parameters were used on no rank.
  at::Tensor
      locally_used_;  // int32 on the CPU (pinned when on_device_); written by index from hooks
  // What the used-map all-reduce runs on: locally_used_ itself, or (on_device_) a device tensor
  // made once and filled by an asynchronous copy from the pinned map.
  at::Tensor used_buffer_;
  c10::intrusive_ptr<c10d::Work> used_work_;  // launched at first hook; null when not needed
  std::vector<bool> globally_used_;  // valid after wait_used_map(); all true without the map
  bool used_map_ready_ = false;
  // Pre-backward grads of locally unused parameters, restored if no rank used them.
  std::vector<at::Tensor> saved_unused_grads_;
  size_t next_bucket_ = 0;     // buckets [0, next_bucket_) are launched this iteration
  size_t next_to_finish_ = 0;  // buckets [0, next_to_finish_) are written back this iteration
  int64_t divisor_ = 0;        // 0: the world size
  int64_t num_sync_backwards_ = 0;
  int64_t num_plan_changes_ = 0;
  int64_t forward_end_ns_ = 0;  // set by prepare_for_backward: backward's start for the timeline
  bool hooks_frozen_ = false;   // a backward ran: hook and optimizer can no longer be changed
  IterationTimeline timeline_;
};

// Waits for `future` at most `timeout`; rethrows its error or names `what` and the timeout, and
// with `pg` which rank is behind (see [Note: sequence numbers]).
void wait_future(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                 std::chrono::milliseconds timeout, const std::string& what,
                 const comm::ProcessGroup* pg = nullptr);

}  // namespace ddp::reducer
