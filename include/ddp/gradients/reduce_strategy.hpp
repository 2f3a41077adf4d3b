#pragma once
// ReduceStrategy: how one kind of bucket is reduced inside the GradientRuntime
// (gradient_runtime.hpp). Two kinds exist, chosen once when the runtime is made and then composed:
//   ReplicaBuckets  replicated parameters, all-reduced (DDP, DEFAULT's parameters that stay whole)
//   UnitBuckets     sharded units, reduce-scattered (FULLY_SHARD, DEFAULT's units)
// The runtime keeps the one iteration state, the listeners and the comm hook, and drives every
// strategy it holds through the same events, under its lock; it never asks which kinds it holds.
// A feature one kind has and the other lacks (DDP's graph planning and join, a unit's fill state)
// answers "nothing here" by default.
//
// Numbering: the runtime numbers parameters and buckets strategy after strategy (units first);
// `events()` turns a strategy's own numbers into the runtime's for the listeners, and a comm
// hook's GradBucket::index is the runtime's bucket number (events().first_bucket() + b).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/gradients/group_events.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::gradients {

// One gradient as a strategy takes it, under the runtime's lock, after the backward's first
// transition: whether the backward is synchronized, how many synchronized backwards came before,
// and whether some listener wants buckets finished as soon as their reduction completes.
struct GradientArrival {
  bool sync = true;
  int64_t num_sync_backwards = 0;
  bool early_finish = false;
};

class ReduceStrategy {
 public:
  // `listeners`: the runtime's list, which outlives the strategy.
  explicit ReduceStrategy(const std::vector<GradientListener*>& listeners) : events_(listeners) {}
  virtual ~ReduceStrategy() = default;
  ReduceStrategy(const ReduceStrategy&) = delete;
  ReduceStrategy& operator=(const ReduceStrategy&) = delete;

  // The strategy's parameters, in its own numbering, and its plan.
  virtual const std::vector<at::Tensor>& params() const = 0;
  virtual const std::vector<std::string>& names() const = 0;
  virtual const std::vector<buckets::ParamSpec>& specs() const = 0;
  virtual const buckets::BucketPlan& plan() const = 0;
  // What runs without a comm hook ("allreduce", "reduce_scatter").
  virtual const char* builtin_reduction() const = 0;
  GroupEvents& events() { return events_; }

  // The runtime that executes the plan, made again after every plan change and a new hook.
  virtual void make_runtime(const hooks::CommHookPtr& hook, int64_t plan_epoch) = 0;
  // A forward whose backward is synchronized: `reachable` (replicated parameters that can get a
  // gradient; empty: all), `unit_order` (units in the order their gradients should complete).
  // Returns whether the plan changed (the runtime then makes new runtimes).
  virtual bool prepare(const std::vector<bool>& reachable,
                       const std::vector<size_t>& unit_order) = 0;
  // Start of a forward: hooks that must run on the current stream move to it.
  virtual void follow_current_stream() {}

  // A backward's first event, synchronized or local (no_sync).
  virtual void start_backward(bool sync, int64_t num_sync_backwards) = 0;
  // Before the state check of every gradient (a unit drops the .grad it no longer needs).
  virtual void before_gradient() {}
  // The error when parameter p's gradient comes with no forward since the last backward.
  virtual std::string gradient_without_forward(size_t p) const = 0;
  // Parameter p's gradient (`incoming`: the tensor a unit's hook sees; undefined for replicas,
  // whose hook runs after accumulation). Returns the unit it completed, or -1.
  virtual int64_t gradient_ready(size_t p, const at::Tensor& incoming,
                                 const GradientArrival& arrival) = 0;
  // End of a local backward (no_sync): what a unit counted is dropped; replicas keep their marks.
  virtual void end_local_backward() {}
  // End of a synchronized backward: every reduction finished and written back (even after an
  // error: those collectives are matched with the other ranks'), then a failure rethrown.
  virtual void finish_backward(int64_t num_sync_backwards) = 0;
  // After a synchronized backward that succeeded, before the listeners hear of it.
  virtual void succeeded(int64_t /*num_sync_backwards*/) {}
  // After the listeners: the plan rebuilt from the observed order, once; returns whether it
  // changed.
  virtual bool rebuild_once() { return false; }
  virtual void reset() = 0;

  // DDP's features (replicated parameters only).
  virtual bool needs_walk(int64_t /*num_sync_backwards*/) const { return false; }
  virtual bool awaiting_plan() const { return false; }
  // Graph planning: nullopt when this kind takes no predicted order, else whether it changed.
  virtual std::optional<bool> set_predicted_order(const std::vector<size_t>& /*predicted*/) {
    return std::nullopt;
  }
  // Join: whether a rank out of data can issue this kind's collectives over zeros.
  virtual bool joins() const { return false; }
  virtual void set_divisor(int64_t /*divisor*/) {}
  virtual void shadow(int64_t /*num_sync_backwards*/) {}

  // A unit's state in this backward (sharded units only).
  virtual bool filled(size_t /*unit*/) const { return false; }
  virtual int64_t input_bytes() const { return 0; }
  // Bucket b's flat buffer (undefined while not allocated).
  virtual const at::Tensor& bucket_buffer(size_t b) const = 0;

 protected:
  GroupEvents events_;
};

}  // namespace ddp::gradients
