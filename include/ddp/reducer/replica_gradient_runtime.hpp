#pragma once
// ReplicaGradientRuntime: averages gradients over all ranks while backward is still running. It is
// the thin orchestrator of the gradient path; each concern lives in its own piece:
//   AutogradHooks   accumulator post-hooks and the end-of-backward callback (autograd_hooks.hpp)
//   GradLayout      flat storage per bucket and each parameter's slot in it (buckets/)
//   BucketRuntime   counts ready gradients, launches and finishes the reductions (bucket_runtime)
//   UnusedParams    reachability, the used-parameter map, static_graph's record (unused_params)
//   listeners       the optimizer in backward, the stats timeline, ... (reducer_events.hpp)
// What stays here: the iteration state machine, the plan's life cycle (initial, predicted,
// rebuilt), moving gradients into their slots and the averaged ones back to param.grad.
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
//   finish = wait, write the averaged gradients back, tell the listeners (optimizer in backward)
//
// [Note: streams] On CUDA the reducer launches no kernel of its own on a side stream and never
// synchronizes the device. Gradients are copied into their bucket on the stream that produced them
// (the autograd engine's current stream for the device). ProcessGroupNCCL runs each all-reduce on
// its own communication stream after an event recorded on that compute stream, so the reduction
// starts when the bucket's last gradient is written, while the compute stream goes on with the
// rest of backward. Finishing makes the compute stream wait on the all-reduce's end event
// (ProcessGroup::wait_on_stream), at the end of backward or, with a listener that wants early
// finishes, only for buckets whose event has already fired (Work::isCompleted polls it): compute
// never waits on communication it does not consume.
//
//   compute  |bwd fc4|copy|bwd fc3..fc2|copy|bwd fc1|copy|   wait(e0) wait(e1) wait(e2)|optimizer
//   nccl            \__allreduce b0__/   \__allreduce b1__/  \__ b2 __/
//                   ^ event: b0 written   (each all-reduce records an end event e_b)
//
// Host-side work per gradient, on the autograd thread (what a CUDA-graph capture must do without):
// the reducer's mutex, the state checks, one comparison of param.grad with its slot (a copy only
// when they differ), the bucket counter (BucketRuntime), one virtual call per listener, and with
// find_unused_parameters a write into the host-side used map. Per iteration: one engine callback,
// one steady-clock read in prepare_for_backward, and with the used map one device-to-host copy.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/buckets/grad_layout.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/reducer/autograd_hooks.hpp"
#include "ddp/reducer/bucket_runtime.hpp"
#include "ddp/reducer/iteration_state.hpp"
#include "ddp/reducer/reducer_events.hpp"
#include "ddp/reducer/reducer_options.hpp"
#include "ddp/reducer/unused_params.hpp"

namespace ddp::reducer {

class ReplicaGradientRuntime {
 public:
  // `params` are the distinct parameters that require grad, in registration order; `names` their
  // qualified names. The reducer installs a post-hook on each parameter's gradient accumulator.
  // `expect_sparse[i]`: parameter i produces sparse gradients (Embedding with sparse=true); it gets
  // a bucket of its own and is reduced as sparse. Empty: none.
  ReplicaGradientRuntime(std::vector<at::Tensor> params, std::vector<std::string> names,
                         comm::ProcessGroupPtr process_group, ReducerOptions options,
                         std::vector<bool> expect_sparse = {});
  ~ReplicaGradientRuntime();
  ReplicaGradientRuntime(const ReplicaGradientRuntime&) = delete;
  ReplicaGradientRuntime& operator=(const ReplicaGradientRuntime&) = delete;

  // Replaces the built-in average. Once, before the first backward.
  void register_comm_hook(hooks::CommHookPtr hook);
  // Adds a listener to the gradient path's events (reducer_events.hpp); it must outlive the
  // reducer or be removed first. Before the first backward; `what` names it in that error.
  void add_listener(ReducerListener* listener, const std::string& what);
  void remove_listener(ReducerListener* listener);
  // A synchronized or local backward has run: hooks and listeners can no longer change.
  bool backward_ran() const;

  // Start of a forward (before it builds its graph): the gradient hooks move to the current stream
  // if it changed (AutogradHooks::follow_current_stream), so that a step warmed up and captured
  // on a side stream (graphs/captured_step.hpp) finds its accumulators there.
  void follow_current_stream();
  // End of a forward whose backward must be synchronized. `reachable` (from the graph walk over
  // the forward's outputs, planner/) says which parameters can get a gradient; empty: all of them.
  // Needed with find_unused_parameters and in static_graph's first iteration (needs_walk()).
  void prepare_for_backward(std::vector<bool> reachable = {});
  bool needs_walk() const;
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
  // The flat storage of dense bucket b (tests check views alias it).
  const at::Tensor& bucket_buffer(size_t b) const { return layout_->storage(b); }
  // Synchronized backward passes completed so far.
  int64_t num_synchronized_backwards() const { return num_sync_backwards_; }
  // How often the plan changed (graph planning or rebuild): GradBucket::plan_epoch.
  int64_t num_plan_changes() const { return num_plan_changes_; }
  // Called with the new table whenever the plan changes (rank 0 prints it when verbose).
  void on_plan_change(std::function<void(const std::string& table)> callback);

 private:
  // Life cycle of one iteration; checked at every transition, named in errors.
  using State = IterationState;
  static const char* state_name(State s) { return iteration_state_name(s); }

  void on_grad_ready(size_t index);  // from the accumulator post-hook, on the autograd thread
  // Under a CUDA-graph capture: refuses, by name, what a replay cannot repeat (the used-parameter
  // map read on the host every step, Gloo's host collectives).
  void refuse_capture_if_host_bound() const;
  void begin_sync_backward();
  void mark_ready(size_t index, bool used);  // gradient into its slot, then the runtime
  void launched(size_t count);               // tell listeners about the newest launches
  void finish_buckets(bool only_completed);  // in order; waits unless only_completed
  void write_back(const BucketRuntime::Finished& finished);
  void finalize_backward();  // the end-of-backward engine callback
  void reset_iteration();
  void build_plan(const std::vector<size_t>& order);
  std::vector<size_t> agree_on_order(std::vector<size_t> order, const std::string& what);
  std::vector<size_t> complete_order(const std::vector<size_t>& partial) const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<buckets::ParamSpec> specs_;
  comm::ProcessGroupPtr pg_;
  ReducerOptions options_;
  hooks::CommHookPtr hook_;  // null: the built-in average
  std::vector<ReducerListener*> listeners_;
  bool early_finish_ = false;  // some listener wants buckets finished as soon as they complete
  std::function<void(const std::string&)> plan_callback_;

  // The plan and what executes it; replaced together by build_plan. runtime_ refers to plan_ and
  // *layout_, so it is destroyed first.
  buckets::BucketPlan plan_;
  std::vector<size_t> plan_order_;  // the order plan_ was built from
  std::unique_ptr<buckets::GradLayout> layout_;
  std::unique_ptr<BucketRuntime> runtime_;

  UnusedParams unused_;
  mutable std::mutex mutex_;  // hooks and the callback may run on autograd worker threads
  State state_ = State::kIdle;
  bool planned_ = false;                // graph planning or reverse order has been settled
  bool rebuilt_ = false;                // the post-iteration-1 rebuild is done (or not needed)
  std::vector<size_t> observed_order_;  // this iteration's ready order (for the rebuild)
  std::vector<bool> ready_;             // per parameter, this iteration; reset at finalize
  // Pre-backward grads of locally unused parameters, restored if no rank used them.
  std::vector<at::Tensor> saved_unused_grads_;
  int64_t divisor_ = 0;  // 0: the world size
  int64_t num_sync_backwards_ = 0;
  int64_t num_plan_changes_ = 0;
  int64_t forward_end_ns_ = 0;  // set by prepare_for_backward: backward's start for listeners
  bool hooks_frozen_ = false;   // a backward ran: hook and listeners can no longer be changed

  // Last member: its destructor removes the hooks before anything they use is destroyed.
  std::unique_ptr<AutogradHooks> autograd_hooks_;
};

}  // namespace ddp::reducer
