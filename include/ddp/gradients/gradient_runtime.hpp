#pragma once
// GradientRuntime: THE gradient path of every style. It averages gradients over the ranks while
// backward is still running, in buckets whose reduction is chosen per bucket kind, once, at
// construction (reduce_strategy.hpp): all-reduced for replicated parameters (DDP, DEFAULT's whole
// ones: ReplicaBuckets), reduce-scattered for sharded units (FULLY_SHARD, DEFAULT's units:
// UnitBuckets). DEFAULT is one path: one iteration state, one listener list (so its stats and
// trace cover every bucket), one comm hook, one end-of-backward callback; the runtime drives its
// strategies through the same events and never branches on which kinds it holds.
//
//   what it owns              the iteration state (checked at every transition), the listeners,
//                             the comm hook, the plan epoch, the count of synchronized backwards
//   what each strategy owns   its parameters' hooks, plan, storage and BucketRuntime (a
//                             strategy's buckets launch in its plan order; the strategies'
//                             launches interleave as their gradients come, the same on every
//                             rank: same model code, same engine order)
//   numbering                 the units' parameters and buckets first, then the replicated ones
//                             (GroupEvents): the listeners, the merged plan() and a comm hook's
//                             GradBucket::index see one model
//
// One synchronized backward:
//
//   prepare_for_backward (forward) -> first gradient (or start_backward from the model's output
//   node): listeners' backward_started, the used map's collective, the one end-of-backward
//   callback queued (autograd/end_of_backward.hpp) -> gradients: each group launches full buckets
//   -> end of backward: units finished (shards written), replicated buckets finished (written
//   back), backward_finished, at most one plan rebuild
//
// Invariants (docs/design/invariants.md): the equivalence of every rank's gradients with the
// single-process gradient; buckets launched in each group's plan order on every rank, the moment
// their last gradient is ready; backward does not return before every bucket has finished and
// been written back (the end-of-backward callback waits for them).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/gradients/gradient_events.hpp"
#include "ddp/gradients/iteration_state.hpp"
#include "ddp/gradients/reduce_strategy.hpp"
#include "ddp/gradients/replica_buckets.hpp"
#include "ddp/gradients/unit_buckets.hpp"
#include "ddp/gradients/unit_storage.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::gradients {

// Where the sharded units reduce when it is not the runtime's group: hybrid sharding ([Note:
// hybrid sharding], unit_buckets.hpp).
struct UnitGroups {
  // The units' reduce-scatters (the shard group); null: the runtime's group.
  comm::ProcessGroupPtr shard;
  // Null (flat sharding), or the group across which each reduced shard is then averaged.
  comm::ProcessGroupPtr replicate;
};

class GradientRuntime {
 public:
  // `units` (may be empty) are reduce-scattered, their `observer` (the sharded runtime; needed
  // with units) outlives the runtime; `replicas` (may hold no parameters) are all-reduced over
  // `pg`, every rank that holds them; the units over `unit_groups` (default: `pg`, flat).
  GradientRuntime(comm::ProcessGroupPtr pg, std::vector<ReduceUnit> units, UnitObserver* observer,
                  ReplicaParams replicas, UnitGroups unit_groups = {});
  ~GradientRuntime();
  GradientRuntime(const GradientRuntime&) = delete;
  GradientRuntime& operator=(const GradientRuntime&) = delete;

  // Replaces the built-in average of every bucket. Once, before the first backward.
  void register_comm_hook(hooks::CommHookPtr hook);
  // Adds a listener to the gradient path's events (gradient_events.hpp); it must outlive the
  // runtime or be removed first. Before the first backward; `what` names it in that error.
  void add_listener(GradientListener* listener, const std::string& what);
  void remove_listener(GradientListener* listener);
  // A synchronized or local backward has run: hooks and listeners can no longer change.
  bool backward_ran() const;
  // Throws naming `what` ("zero_grad()") while a backward runs.
  void require_not_in_backward(const char* what) const;
  std::string comm_hook_name() const;

  // Start of a forward: the replicated parameters' accumulator hooks move to the current stream
  // if it changed (AutogradHooks::follow_current_stream; graphs/captured_step.hpp).
  void follow_current_stream();
  // A forward whose backward is synchronized. `reachable` (replicated parameters, from the graph
  // walk over the forward's outputs, planner/): which can get a gradient; empty: all of them.
  // `unit_order`: units in the order their gradients are expected to complete.
  void prepare_for_backward(std::vector<bool> reachable = {},
                            const std::vector<size_t>& unit_order = {});
  // The forward's end, when it comes after prepare_for_backward (the sharded runtime prepares at
  // its pre-forward): what the listeners take as the start of backward.
  void note_forward_end();
  // A forward under no_sync: its backward only accumulates gradients locally.
  void prepare_for_local_backward();
  // From a node on the model's output: the backward has begun, even if no gradient reaches a
  // parameter (then units reduce zeros, as every rank must issue the same collectives).
  void start_backward();
  // Drops the iteration (an evaluation forward, or after an error): nothing in flight is waited.
  void reset();

  // DDP's features of the replicated parameters.
  bool needs_walk() const;
  // Graph planning (planner/): the gradient-ready order predicted at the first forward, before
  // prepare_for_backward. Rank 0's prediction is broadcast; the plan is rebuilt if it differs,
  // and no rebuild happens after iteration 1.
  void set_predicted_order(const std::vector<size_t>& predicted);
  bool awaiting_plan() const;
  // Join: the average of the next backward divides by `divisor` (the ranks still training).
  void set_divisor_for_next_backward(int64_t divisor);
  // Join: a rank out of data issues the collectives of a synchronized backward, over zeros.
  void shadow_backward();
  // Called with the bucket table whenever the plan changes after construction.
  void on_plan_change(std::function<void(const std::string&)> callback);

  // The sharded units' state in this backward.
  bool filled(size_t unit) const;
  int64_t input_bytes() const;

  // Every group's buckets in one plan (units first), parameters numbered the same way.
  const buckets::BucketPlan& plan() const { return plan_; }
  const std::vector<buckets::ParamSpec>& param_specs() const { return specs_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // Bucket b's flat buffer, b in the merged plan (tests check that views alias it).
  const at::Tensor& bucket_buffer(size_t b) const;
  int64_t num_synchronized_backwards() const;
  int64_t num_plan_changes() const { return num_plan_changes_; }
  std::string bucket_table() const;

 private:
  using State = IterationState;

  // Every strategy's gradient hooks call this: `strategy`'s parameter p, with the gradient
  // `incoming` where the hook sees it.
  void on_gradient(size_t strategy, size_t p, const at::Tensor& incoming);
  // Under the lock: the transition of a backward's first event. Returns whether it was the first.
  bool start_backward_once();
  void start_sync_backward();
  void finish_backward();
  void end_local_backward();
  void reset_iteration();
  // A strategy's plan changed: every strategy gets a runtime of the new epoch, the merged plan is
  // remade. `announce`: tell on_plan_change's callback.
  void plan_changed(bool announce);
  void merge_plans();
  void check_not_in_backward(const char* what) const;

  comm::ProcessGroupPtr pg_;
  UnitObserver* observer_;
  hooks::CommHookPtr hook_;  // null: the built-in average
  std::vector<GradientListener*> listeners_;
  bool early_finish_ = false;  // some listener wants buckets finished as soon as they complete
  std::function<void(const std::string&)> plan_callback_;

  // The merged view: units' parameters then the replicated ones; plan_ remade at plan changes.
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<buckets::ParamSpec> specs_;
  buckets::BucketPlan plan_;

  mutable std::mutex mutex_;  // hooks and the callback may run on autograd worker threads
  State state_ = State::kIdle;
  bool hooks_frozen_ = false;  // a backward ran: hook and listeners can no longer be changed
  int64_t num_sync_backwards_ = 0;
  int64_t num_plan_changes_ = 0;  // also the plan epoch hooks see
  int64_t forward_end_ns_ = 0;    // prepare / note_forward_end: backward's start for listeners

  // The strategies, units first, chosen once; last: their destructors remove the hooks before
  // anything the hooks use goes.
  std::vector<std::unique_ptr<ReduceStrategy>> strategies_;
};

}  // namespace ddp::gradients
