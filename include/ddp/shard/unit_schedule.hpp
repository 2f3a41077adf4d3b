#pragma once
// UnitSchedule: when each unit's parameters are gathered, prefetched and released, both
// directions of a unit's communication (FSDP2's FSDPParamGroup: pre/post forward, pre backward).
// It owns the flat parameter groups of the units that shard something, records the forward's unit
// order (a backward runs the reverse; prefetch follows the last complete forward's), and keeps
// the peak of gathered memory. ShardedModule drives it from the forward protocol and the autograd
// nodes; the gradients themselves go through gradients::GradientRuntime, whose filled() tells the
// schedule not to gather a unit that was already reduced.
//
//   forward    begin_forward: gather the units the model does not run through run_unit (the
//              root); per unit: before_unit_forward (gather it, prefetch the next of the last
//              forward), after_unit_forward (release it under reshard_after_forward)
//   backward   start_backward: prefetch the forward's last unit; per unit: before_unit_backward
//              (gather unless reduced, prefetch the one before); unit_reduced: release (no_sync)

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/shard/flat_param_group.hpp"
#include "ddp/shard/gather_pool.hpp"
#include "ddp/shard/shard_options.hpp"
#include "ddp/shard/shard_plan.hpp"
#include "ddp/wrap/gathered_bytes.hpp"

namespace ddp::gradients {
class GradientRuntime;
}

namespace ddp::shard {

// What a sharded step holds beyond the shards, by owner (bytes): wrap/gathered_bytes.hpp.
using wrap::GatheredBytes;

class UnitSchedule {
 public:
  // One FlatParamGroup per unit of `plan` that shards a parameter of `params` (the plan's
  // parameters, registration order) over `pg`. `options`: reshard_after_forward and prefetch.
  UnitSchedule(const ShardPlan& plan, const std::vector<at::Tensor>& params,
               const comm::ProcessGroupPtr& pg, const ShardOptions& options);
  UnitSchedule(const UnitSchedule&) = delete;
  UnitSchedule& operator=(const UnitSchedule&) = delete;

  // The gradient path of the groups (made after them, from them): its filled() units are not
  // gathered again in backward, and its reduce inputs count as gathered memory.
  void attach(const gradients::GradientRuntime* reducer) { reducer_ = reducer; }

  size_t num_groups() const { return groups_.size(); }
  FlatParamGroup& group(size_t g) { return *groups_[g]; }
  const std::vector<std::unique_ptr<FlatParamGroup>>& groups() const { return groups_; }
  // Plan unit -> group (-1: the unit shards nothing), and back.
  int group_of_unit(size_t unit) const { return group_of_unit_[unit]; }
  size_t unit_of_group(size_t g) const { return unit_of_group_[g]; }
  // Whether the model ran unit `unit` through run_unit (in some forward so far).
  bool run_by_model(size_t unit) const { return run_by_model_[unit]; }
  // Unit indices in the order the last complete forward ran them through run_unit.
  const std::vector<size_t>& last_order() const { return last_order_; }
  // The groups in the order their gradients are expected to complete: the reverse of the last
  // complete forward's unit order (units not run through run_unit, the root among them, absent:
  // they go last).
  std::vector<size_t> expected_backward_order() const;

  // A forward starts: its order is recorded anew, and the units the model does not run through
  // run_unit are gathered for the whole step.
  void begin_forward();
  // A training forward ended: its order becomes the last one. Returns true the first time (the
  // caller then checks which units never ran through run_unit).
  bool end_forward();
  // Unit `unit`'s forward starts (`in_forward`: the module's forward, not a recompute in backward).
  void before_unit_forward(size_t unit, bool in_forward);
  // Unit `unit`'s forward ended: its full parameters go under reshard_after_forward, or when no
  // backward follows (`grad_enabled` false).
  void after_unit_forward(size_t unit, bool grad_enabled);
  // The backward starts: the forward's last unit runs its backward first, so it is prefetched.
  void start_backward();
  // Unit `unit`'s backward starts: gathered unless already reduced, the one before prefetched.
  void before_unit_backward(size_t unit);
  // Group `g`'s gradients are complete: synchronized, its reduce input holds them (memory noted);
  // under no_sync the full gradients stay and a unit the model runs releases its parameters.
  void unit_reduced(size_t g, bool synchronized);
  // Every group back to its shards (an evaluation forward, or after an error).
  void reshard_all();
  // Every group gathered, until reshard_all (an Evaluation: the module used whole).
  void gather_all();
  // The step is over (end of backward): the gather pool's buffer is freed, so that between steps
  // a rank holds its shards only.
  void end_step();

  // The most full buffers, gathered outputs and reduce inputs held at once since the last reset,
  // in bytes.
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  // The same by owner, each its own peak: units' full parameter buffers, gather outputs (the
  // pool's buffer and any of their own), reduce inputs.
  const GatheredBytes& peak_by_owner() const { return peak_by_owner_; }
  void reset_peak() {
    peak_gathered_bytes_ = 0;
    peak_by_owner_ = GatheredBytes{};
  }
  void note_memory();

 private:
  void gather(size_t g);
  void prefetch_after(size_t unit, bool backward);
  bool reduced(size_t g) const;

  bool reshard_after_forward_;
  bool prefetch_;
  const gradients::GradientRuntime* reducer_ = nullptr;
  // Where every group's all-gathers land (one unit's bytes); declared before the groups, which
  // point at it.
  GatherPool gather_pool_;
  std::vector<std::unique_ptr<FlatParamGroup>> groups_;  // units with sharded parameters
  std::vector<int> group_of_unit_;                       // plan unit -> groups_ index, or -1
  std::vector<size_t> unit_of_group_;
  // Units seen by run_unit in a forward; only they are gathered per unit (the rest at begin).
  std::vector<bool> run_by_model_;
  std::vector<size_t> order_;       // this forward's run_unit order (first visit of each unit)
  std::vector<size_t> last_order_;  // the last complete forward's: prefetch follows it
  bool first_forward_done_ = false;
  int64_t peak_gathered_bytes_ = 0;  // see peak_gathered_bytes()
  GatheredBytes peak_by_owner_;      // see peak_by_owner()
};

}  // namespace ddp::shard
