#pragma once
// UnitGradientRuntime: the gradient path of FULLY_SHARD (and of DEFAULT's sharded units), on the
// same BucketRuntime, comm hooks and listeners as DDP's ReplicaGradientRuntime. Each unit is one
// bucket whose reduction is the averaged reduce-scatter of the unit's (world, S) layout ([Note:
// flat shard layout], shard/flat_param_group.hpp): rank r receives row r, its flat shard of the
// average. The sharded runtime (shard/sharded_module.hpp) schedules gathers, prefetches and
// releases and moves parameters between shards and full buffers; this class counts ready gradients,
// builds a unit's reduce input when the unit's last gradient arrives, launches in plan order,
// finishes at the end of backward and tells the listeners (stats timeline, optimizer in backward).
//
//   unit u's last gradient -> fill_reduce_input(u's (world, S) input from the members' .grad) ->
//   launch in plan order (built-in reduce-scatter, or the comm hook with
//   GradBucket::reduce_scatter)
//   ... end of backward: the rest launched (a missing gradient counts as zeros), every reduction
//   finished in order -> finish_reduce_scatter(shard) -> bucket_finished(u) -> iteration_finished
//
// [Note: hooks that survive set_] One tensor hook per parameter, registered once. A tensor hook of
// a leaf lives on the tensor, not on its gradient accumulator, so it survives the set_() and
// set_data() with which the sharded runtime points a parameter at its shard or its full buffer;
// an accumulator post-hook would not (set_() drops the accumulator even at the same shape). It
// runs before the engine accumulates into .grad, with this backward's whole gradient of the
// parameter: so the reduce input is built from the other members' .grad and, for the parameter
// whose hook completes the unit, this incoming gradient.
//
// Memory: a unit's reduce input exists from its last gradient until its reduce-scatter finished;
// before building one, the reductions in flight are finished (each unit's result is kept until
// the end of backward, shard-sized), so a backward holds one unit's input at a time, not the
// model's. The plan is the reverse of the forward's unit order (the order gradients complete),
// so a unit launches the moment it is filled; it changes (a new epoch for the hooks) when that
// order changes, identically on every rank (they run the same model code).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_buffers.hpp"
#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/reducer/bucket_runtime.hpp"
#include "ddp/reducer/iteration_state.hpp"
#include "ddp/reducer/reducer_events.hpp"
#include "ddp/reducer/unit_storage.hpp"

namespace ddp::reducer {

// One unit as the reducer sees it: whose gradients it reduces and how its input is made.
struct ReduceUnit {
  std::string name;                // for tables and errors
  std::vector<at::Tensor> params;  // the members (tensor hooks go on them)
  std::vector<std::string> names;  // their qualified names
  // Member i's first column in a row of the (world, S) layout, and S.
  std::vector<int64_t> offsets;
  int64_t row_numel = 0;
  at::TensorOptions options;  // the reduce input's dtype (reduce_dtype) and device
  // Fills the reduce input and takes back the reduced shard (the unit's flat parameter group);
  // outlives the reducer.
  UnitStorage* storage = nullptr;
};

class UnitGradientRuntime {
 public:
  // `observer` (the sharded runtime) outlives the reducer.
  UnitGradientRuntime(std::vector<ReduceUnit> units, comm::ProcessGroupPtr pg,
                      UnitObserver& observer);
  ~UnitGradientRuntime();  // removes the tensor hooks
  UnitGradientRuntime(const UnitGradientRuntime&) = delete;
  UnitGradientRuntime& operator=(const UnitGradientRuntime&) = delete;

  // As ReplicaGradientRuntime's: once, before the first backward.
  void register_comm_hook(hooks::CommHookPtr hook);
  void add_listener(ReducerListener* listener, const std::string& what);
  std::string comm_hook_name() const;

  // Before or after a forward whose backward is synchronized. `order`: units in the order their
  // gradients are expected to complete (the reverse of the forward's); units missing from it go
  // last.
  void prepare_for_backward(const std::vector<size_t>& order);
  // The forward's end, when it comes after prepare_for_backward (the sharded runtime prepares at
  // its pre-forward): what the listeners take as the start of backward.
  void note_forward_end();
  // End of a forward under no_sync: gradients accumulate in the members' .grad.
  void prepare_for_local_backward();
  // Whether unit u's reduce input was built in this backward (its gradients are no longer in
  // the members' .grad; do not gather it again).
  bool filled(size_t unit) const;
  // From the sharded runtime's end-of-backward callback. Synchronized: launches what is left,
  // finishes every reduction in plan order, then for each unit hands its storage this rank's S
  // elements (UnitStorage::finish_reduce_scatter) and tells the listeners. No_sync: only resets.
  // Returns whether it reduced.
  bool finish_backward();
  // Drops the iteration (an evaluation forward, or after an error): nothing in flight is waited.
  void reset();

  // The units as buckets, in launch order; params index the flattened member list.
  const buckets::BucketPlan& plan() const { return plan_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  int64_t num_synchronized_backwards() const { return num_sync_backwards_; }
  // Bytes of reduce inputs alive now (at most one unit's, plus any waiting for a predecessor).
  int64_t input_bytes() const;

 private:
  using State = IterationState;

  // Transient per-bucket inputs: defined from a unit's fill to its finish.
  class Inputs : public buckets::BucketBuffers {
   public:
    size_t num_buckets() const override { return tensors.size(); }
    const at::Tensor& storage(size_t b) const override { return tensors[b]; }
    const at::Tensor& data(size_t b) const override { return tensors[b]; }
    std::vector<at::Tensor> tensors;
  };

  void on_grad(size_t param, const at::Tensor& incoming);
  void begin_sync_backward();
  void drop_stale_grad();
  void build_plan(const std::vector<size_t>& unit_order);
  void fill_and_register(size_t unit, int64_t member, const at::Tensor& incoming);
  void finish_in_flight();
  void reset_iteration();

  std::vector<ReduceUnit> units_;
  comm::ProcessGroupPtr pg_;
  UnitObserver& observer_;
  hooks::CommHookPtr hook_;
  std::vector<ReducerListener*> listeners_;
  std::vector<at::Tensor> params_;  // every unit's members, unit after unit
  std::vector<std::string> names_;
  std::vector<size_t> unit_of_param_;    // flattened member -> unit
  std::vector<size_t> member_of_param_;  // flattened member -> index in its unit
  std::vector<size_t> first_param_;      // unit -> its first flattened member
  std::vector<unsigned> hook_ids_;       // per flattened member

  // The plan (bucket b = unit unit_at_[b]) and its runtime, replaced together.
  buckets::BucketPlan plan_;
  std::vector<size_t> unit_at_;    // bucket -> unit
  std::vector<size_t> bucket_of_;  // unit -> bucket
  Inputs inputs_;
  std::unique_ptr<BucketRuntime> runtime_;
  int64_t plan_epoch_ = 0;

  mutable std::mutex mutex_;  // hooks may run on autograd worker threads
  State state_ = State::kIdle;
  bool hooks_frozen_ = false;
  std::vector<bool> ready_;            // per flattened member, this backward
  std::vector<size_t> ready_count_;    // per unit
  std::vector<bool> filled_;           // per unit
  std::vector<at::Tensor> shards_;     // per bucket: the finished result, until write-back
  std::vector<int64_t> comm_done_ns_;  // per bucket: BucketFinished::comm_done_ns
  int64_t stale_grad_ = -1;     // the member whose full .grad the engine set after its unit filled
  int64_t forward_end_ns_ = 0;  // prepare_for_backward's clock: backward's start for listeners
  int64_t num_sync_backwards_ = 0;
};

}  // namespace ddp::reducer
