#pragma once
// UnitBuckets: the sharded units' buckets (FULLY_SHARD, and DEFAULT's sharded units),
// reduce-scattered: one reduce strategy of the GradientRuntime (reduce_strategy.hpp), which keeps
// the one iteration state and calls this under its lock. Each unit is one bucket whose reduction is
// the averaged reduce-scatter of the unit's (world, S) layout ([Note: flat shard layout],
// shard/flat_param_group.hpp): rank r receives row r, its flat shard of the average. The sharded
// runtime (shard/sharded_module.hpp) schedules gathers, prefetches and releases; this group builds
// a unit's reduce input when the unit's last gradient arrives (the BucketRuntime's counter says
// when), and at the end of backward hands each unit its shard.
//
//   unit u's last gradient -> finish what is in flight -> fill_reduce_input(u's (world, S) input
//   from the members' .grad) -> launch in plan order (built-in reduce-scatter, or the comm hook
//   with GradBucket::reduce_scatter)
//   ... end of backward: the rest filled and launched (a missing gradient counts as zeros), every
//   reduction finished in order -> finish_reduce_scatter(shard) -> bucket finished
//
// [Note: hooks that survive set_] One tensor hook per parameter, registered once. A tensor hook of
// a leaf lives on the tensor, not on its gradient accumulator, so it survives the set_() and
// set_data() with which the sharded runtime points a parameter at its shard or its full buffer;
// an accumulator post-hook would not (set_() drops the accumulator even at the same shape). It
// runs before the engine accumulates into .grad, with this backward's whole gradient of the
// parameter: so the reduce input is built from the other members' .grad and, for the parameter
// whose hook completes the unit, this incoming gradient.
//
// [Note: hybrid sharding] With a replicate group (FSDP2's HSDP: fully_shard over a 2-D mesh), the
// units are sharded within the shard group (`pg`, the reduce-scatters') and the model is
// replicated across the replicate group: each unit's averaged shard is, once its reduce-scatter
// finished, all-reduced (averaged) across the replicate group, asynchronously, while backward goes
// on; the end of backward waits for those before the storage takes the shard. The average over R
// replicas of the average over S shards is the average over the R * S ranks. A comm hook then
// replaces that all-reduce (its GradBucket is the shard, cross_replica set), not the
// reduce-scatter, as the cross-replica bytes are the ones worth compressing.
//
// Memory: a unit's reduce input exists from its last gradient until its reduce-scatter finished;
// before building one, the reductions in flight are finished (each unit's result is kept until
// the end of backward, shard-sized), so a backward holds one unit's input at a time, not the
// model's, and every unit fills the same buffer. The plan is the reverse of the forward's unit
// order (the order gradients complete), so a unit launches the moment it is filled; it changes (a
// new epoch for the hooks) when that order changes, identically on every rank (they run the same
// model code).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_buffers.hpp"
#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/gradients/bucket_runtime.hpp"
#include "ddp/gradients/reduce_strategy.hpp"
#include "ddp/gradients/unit_storage.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::gradients {

// One unit as the gradient path sees it: whose gradients it reduces and how its input is made.
struct ReduceUnit {
  std::string name;                // its module path, for tables and errors
  size_t index = 0;                // its unit index (ShardPlan::units): what the recorder names
  std::vector<at::Tensor> params;  // the members (tensor hooks go on them)
  std::vector<std::string> names;  // their qualified names
  // Member i's first column in a row of the (world, S) layout, and S.
  std::vector<int64_t> offsets;
  int64_t row_numel = 0;
  at::TensorOptions options;  // the reduce input's dtype (reduce_dtype) and device
  // Fills the reduce input and takes back the reduced shard (the unit's flat parameter group);
  // outlives the runtime.
  UnitStorage* storage = nullptr;
};

class UnitBuckets final : public ReduceStrategy {
 public:
  // Installs a tensor hook on every member: `on_grad(p, incoming)` runs with member p's (in the
  // flattened list, unit after unit) whole gradient of this backward, before it is accumulated.
  // `replicate`: null (flat), or the group across which every reduced shard is averaged ([Note:
  // hybrid sharding]).
  UnitBuckets(std::vector<ReduceUnit> units, comm::ProcessGroupPtr pg,
              comm::ProcessGroupPtr replicate,
              std::function<void(size_t, const at::Tensor&)> on_grad,
              const std::vector<GradientListener*>& listeners);
  ~UnitBuckets() override;  // removes the tensor hooks

  const std::vector<at::Tensor>& params() const override { return params_; }
  const std::vector<std::string>& names() const override { return names_; }
  const std::vector<buckets::ParamSpec>& specs() const override { return specs_; }
  const buckets::BucketPlan& plan() const override { return plan_; }
  const char* builtin_reduction() const override { return "reduce_scatter"; }

  void make_runtime(const hooks::CommHookPtr& hook, int64_t plan_epoch) override;
  // `unit_order`: units in the order their gradients are expected to complete (the reverse of
  // the forward's); units missing from it go last. The plan changes when that order does.
  bool prepare(const std::vector<bool>& reachable, const std::vector<size_t>& unit_order) override;

  // A backward begins: synchronized (the bucket counters armed for launching), or local (counted
  // only, so that a unit's last gradient is still known).
  void start_backward(bool sync, int64_t num_sync_backwards) override;
  // The member whose full .grad the engine set after its unit filled: dropped at the next
  // gradient or the end of backward, which no longer need it.
  void before_gradient() override { drop_stale_grad(); }
  std::string gradient_without_forward(size_t p) const override;
  // Member p's gradient `incoming`. Synchronized: a unit completed by it is filled and launched.
  // Returns the unit p completed, or -1.
  int64_t gradient_ready(size_t p, const at::Tensor& incoming,
                         const GradientArrival& arrival) override;
  void end_local_backward() override { reset(); }
  // Units whose gradients did not all arrive (unused parameters) are filled and launched now, in
  // plan order (every rank issues the same collectives; a missing gradient counts as zeros);
  // every reduction finishes, each unit's storage takes its shard.
  void finish_backward(int64_t num_sync_backwards) override;
  void reset() override;

  // Whether unit u's reduce input was built in this backward (its gradients are no longer in
  // the members' .grad; do not gather it again).
  bool filled(size_t unit) const override { return filled_[unit]; }
  // Bytes of reduce inputs alive now (at most one unit's, plus any waiting for a predecessor).
  int64_t input_bytes() const override;
  // Bucket b's reduce input: defined from its unit's fill to its finish.
  const at::Tensor& bucket_buffer(size_t b) const override { return inputs_.tensors[b]; }

 private:
  // Transient per-bucket inputs: defined from a unit's fill to its finish.
  class Inputs : public buckets::BucketBuffers {
   public:
    size_t num_buckets() const override { return tensors.size(); }
    const at::Tensor& storage(size_t b) const override { return tensors[b]; }
    const at::Tensor& data(size_t b) const override { return tensors[b]; }
    std::vector<at::Tensor> tensors;
  };

  // The reduce input of `unit`: a view of the one buffer every unit of a backward fills in turn
  // ([Note: one reduce input] in the source).
  at::Tensor reduce_input(const ReduceUnit& unit);
  void fill_and_register(size_t unit, int64_t member, const at::Tensor& incoming);
  void drop_stale_grad();
  bool set_order(const std::vector<size_t>& order);
  void finish_in_flight();
  // [Note: hybrid sharding]: bucket b's shard averaged across the replicate group, started.
  void start_cross_replica(size_t b);
  // ... and finished into shards_[b].
  void finish_cross_replica(size_t b);

  std::vector<ReduceUnit> units_;
  comm::ProcessGroupPtr pg_;
  comm::ProcessGroupPtr replicate_;  // null, or of more than one rank: [Note: hybrid sharding]
  hooks::CommHookPtr cross_replica_hook_;  // the comm hook, which takes the cross-replica reduce
  int64_t plan_epoch_ = 0;                 // make_runtime's: what the recorder and hooks see
  int64_t iteration_ = 0;  // synchronized backwards before this one (GradBucket::iteration)
  std::vector<at::Tensor> params_;  // every unit's members, unit after unit
  std::vector<std::string> names_;
  std::vector<buckets::ParamSpec> specs_;
  std::vector<size_t> unit_of_param_;    // flattened member -> unit
  std::vector<size_t> member_of_param_;  // flattened member -> index in its unit
  std::vector<size_t> first_param_;      // unit -> its first flattened member
  std::vector<unsigned> hook_ids_;       // per flattened member

  // The plan (bucket b = unit unit_at_[b]) and its runtime, replaced together.
  buckets::BucketPlan plan_;
  std::vector<size_t> unit_at_;    // bucket -> unit
  std::vector<size_t> bucket_of_;  // unit -> bucket
  Inputs inputs_;
  // The buffer behind every unit's reduce input in one backward (the largest unit's size so far):
  // made at the first fill, dropped at the end of backward. Reused rather than one per unit, so
  // that a backward holds one unit's input however the backend releases its collectives' tensors
  // (Gloo's worker threads drop theirs some time after the wait).
  at::Tensor input_pool_;
  std::unique_ptr<BucketRuntime> runtime_;

  std::vector<bool> ready_;         // per flattened member, this backward
  std::vector<bool> filled_;        // per unit, this backward
  std::vector<at::Tensor> shards_;  // per bucket: the finished result, until write-back
  // Per bucket, the cross-replica average of shards_[b] in flight (one of them, or neither).
  std::vector<c10::intrusive_ptr<c10d::Work>> cross_work_;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> cross_future_;
  // Per bucket, the words for its cross-replica wait's error, made once per plan (not per step).
  std::vector<std::string> cross_what_;
  std::vector<int64_t> comm_done_ns_;  // per bucket: BucketFinished::comm_done_ns
  int64_t stale_grad_ = -1;            // see drop_stale_grad
};

}  // namespace ddp::gradients
