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
//
// Timeline of one synchronized step (two buckets, b0 holds the last layer):
//
//   forward ........ | backward: grads fc4 fc3 | fc2 fc1 | callback: wait b0, b1, write back
//   comm thread              allreduce(b0) --->|allreduce(b1) --->|
//                            ^ b0 full              ^ b1 full

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/reducer/reducer_options.hpp"
#include "ddp/reducer/timeline.hpp"

namespace ddp::reducer {

class Reducer {
 public:
  // `params` are the distinct parameters that require grad, in registration order; `names` their
  // qualified names. The reducer installs a post-hook on each parameter's gradient accumulator.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          comm::ProcessGroupPtr process_group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // End of a forward whose backward must be synchronized. `outputs` are the forward's outputs; with
  // find_unused_parameters the graph behind them decides which parameters count as unused.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  // End of a forward under no_sync: its backward only accumulates gradients locally.
  void prepare_for_local_backward();

  const buckets::BucketPlan& plan() const { return plan_; }
  const std::vector<buckets::ParamSpec>& param_specs() const { return specs_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const ReducerOptions& options() const { return options_; }
  // The flat buffer of bucket b (tests check views alias it).
  const at::Tensor& bucket_buffer(size_t b) const { return buckets_[b].buffer; }
  // Copy of the last synchronized backward's timeline.
  IterationTimeline last_timeline() const;
  // Synchronized backward passes completed so far.
  int64_t num_synchronized_backwards() const { return num_sync_backwards_; }

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
    at::Tensor buffer;   // flat gradients; allocated once, never per step
    size_t pending = 0;  // gradients not yet ready this iteration; launch when it reaches 0
    c10::intrusive_ptr<c10d::Work> work;  // set at launch, cleared at finalize
  };

  friend class GradReadyHook;
  void on_grad_ready(size_t index);  // from the accumulator post-hook, on the autograd thread
  void mark_ready(size_t index, bool used);
  void launch_ready_buckets();
  void launch(size_t bucket);
  void finalize_backward();  // the end-of-backward engine callback
  void reset_iteration();
  at::Tensor& grad_of(size_t index);
  int64_t now_ns() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<buckets::ParamSpec> specs_;
  comm::ProcessGroupPtr pg_;
  ReducerOptions options_;
  buckets::BucketPlan plan_;
  std::vector<BucketState> buckets_;
  // slots_[p]: parameter p's place in its bucket buffer, shaped like the parameter. Made with
  // set_() rather than view ops so it is not an autograd view (Optimizer::zero_grad's detach_
  // accepts it).
  std::vector<at::Tensor> slots_;

  // Hooks: the accumulator nodes are kept alive so the keys stay valid for removal.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  mutable std::mutex mutex_;  // hooks and the callback may run on autograd worker threads
  State state_ = State::kIdle;
  std::vector<bool> ready_;      // per parameter, this iteration; reset at finalize
  std::vector<bool> reachable_;  // find_unused: reachable from this forward's outputs
  // Per parameter: had a gradient from any backward since the last synchronized one (no_sync steps
  // included). All-reduced to decide which parameters were used on no rank.
  at::Tensor locally_used_;  // int32 on the CPU; written by index from hooks
  at::Tensor used_buffer_;  // what the used-map all-reduce runs on (locally_used_ or a device copy)
  c10::intrusive_ptr<c10d::Work> used_work_;  // all-reduce of locally_used_, launched at first hook
  // Pre-backward grads of locally unused parameters, restored if no rank used them.
  std::vector<at::Tensor> saved_unused_grads_;
  size_t next_bucket_ = 0;  // buckets [0, next_bucket_) are launched this iteration
  int64_t num_sync_backwards_ = 0;
  IterationTimeline timeline_;
};

}  // namespace ddp::reducer
