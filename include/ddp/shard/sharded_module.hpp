#pragma once
// ShardedModule: FULLY_SHARD and DEFAULT over a whole module, on top of the shard plan and one
// FlatParamGroup per unit that has sharded parameters.
//
//   construction   rank 0's parameters are broadcast; the plan is made; every unit's sharded
//                  parameters move into its flat shard (the module holds shards between steps);
//                  every named unit's submodule is registered for run_unit (unit/unit_scope.hpp)
//   pre_forward    units the model does not run through run_unit (the root, and on the first
//                  step every unit: the runtime learns which units the model runs) are gathered
//   unit forward   run_unit: gather the unit (prefetch the next one in the last forward's order);
//                  after it, release it (reshard_after_forward) and put a node on its output
//   backward       the output's node gathers the unit again (prefetch the one before); when the
//                  unit's last gradient arrives, the gradient runtime
//                  (gradients/gradient_runtime.hpp: one reduce-scattered bucket per unit, beside
//                  DEFAULT's all-reduced ones; comm hooks and listeners) fills its reduce input
//                  and issues its reduce-scatter; the unit's full parameters are released
//   end of backward  the gradient runtime reduces what is left (unused: zeros) and finishes every
//                  reduce-scatter in order; the parameters move back to their shards with their
//                  gradient shards; listeners (stats, the optimizer in backward) hear of each unit
//   replicated     DEFAULT's replicated parameters go through the same runtime: buckets
//                  all-reduced as their gradients become ready, in the same backward, in the
//                  same stats and trace
//   optimizer      steps on the shards (built after the wrapper: it sees the sharded parameters)
//
//   one unit over time (reshard_after_forward, prefetch):
//     fwd:  [gather u][ forward u ][release]            [gather u][ backward u ][reduce-scatter u]
//                     [gather u+1 (prefetch)]  ...  bwd node on u's output ^          ^ last grad
//
// Every rank issues the same collectives in the same order because they run the same model code:
// the order of forward and backward is the engine's, the same on every rank.
//
// Hybrid sharding (FSDP2's fully_shard over a 2-D mesh, HSDP; DeepSpeed's hpZ / MiCS): over a
// DeviceMesh with dims ("replicate", "shard"), R x S ranks, rank = replica * S + shard. Every
// parameter is sharded within the shard group as above (gathers and reduce-scatters among S ranks,
// one node's when S is a node's GPUs) and replicated across the replicate group: each reduced
// shard is then averaged across the R replicas ([Note: hybrid sharding],
// gradients/unit_buckets.hpp), so only shard-sized all-reduces cross the replicate dim. The
// optimizer state is sharded within the shard group. group() is the whole mesh: rank 0's initial
// parameters and buffers reach every rank, and the buffer broadcast and the forward checks span
// it. The layouts are over mesh {R, S}: replicated on dim 0, the plan's split on dim 1, so a
// checkpoint is written by replica 0 and loads onto any mesh and style.

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/gradients/gradient_options.hpp"
#include "ddp/intake/module_call.hpp"
#include "ddp/layout/layout.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/shard/shard_options.hpp"
#include "ddp/shard/shard_plan.hpp"
#include "ddp/unit/unit_scope.hpp"
#include "ddp/wrap/evaluation.hpp"
#include "ddp/wrap/typed_module.hpp"
#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::shard {

using wrap::GatheredBytes;

// Memory this rank holds, in bytes (CPU: tensor storage; the same numbers on CUDA).
struct ShardMemory {
  int64_t param_bytes = 0;          // parameters between steps: shards + replicated
  int64_t grad_bytes = 0;           // their .grad tensors now
  int64_t peak_gathered_bytes = 0;  // most full buffers + collective buffers held at once
                                    // during the steps since the last reset
  GatheredBytes peak_by_owner;      // each owner's own peak over the same steps
};

class UnitSchedule;  // internal (shard/unit_schedule.hpp): declared, not included

class ShardedModule : public wrap::WrappedModel, private unit::UnitListener {
 public:
  ShardedModule(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr group,
                ShardOptions options = {});
  // Hybrid sharding over `mesh`, whose dims are ("replicate", "shard") (the note above). Refuses
  // another mesh naming its dims.
  ShardedModule(std::shared_ptr<torch::nn::Module> module, const comm::DeviceMesh& mesh,
                ShardOptions options = {});
  ~ShardedModule() override;

  // The group the parameters are sharded over (group() itself unless hybrid), and the one the
  // shards are replicated across (null unless hybrid).
  const comm::ProcessGroupPtr& shard_group() const { return shard_group_; }
  const comm::ProcessGroupPtr& replicate_group() const { return replicate_group_; }

  const ShardPlan& plan() const { return plan_; }
  // Parameter `name` (any of a tied parameter's names) as a layout over this module's group
  // (mesh {world}; hybrid: mesh {R, S}, nothing on dim 0): its whole shape, Shard(0) when the plan
  // shards it (the even split with padding: a rank's real rows are layout::local_shape's, its
  // storage padded_local_shape's), no placement when replicated. Over tensor parallelism, nest it
  // on TensorParallel::layout (layout::nest): FULLY_SHARD appends its placement. Throws naming
  // `name` when unknown.
  layout::Layout layout(const std::string& name) const;
  // [Note: a forward whose backward never runs] Throws naming `operation` and the fix while the
  // parameters are gathered by a forward under grad mode whose backward has not run: then they
  // have their full shapes and no gradients, so a checkpoint, a norm or an optimizer step would
  // see the wrong tensors. Callers that read the parameters between steps call it first.
  void require_between_steps(const char* operation) const;
  const ShardOptions& options() const { return options_; }
  std::string unit_table() const { return format_unit_table(plan_); }
  // Bytes of parameters this rank holds between steps (ShardPlan::local_param_bytes).
  int64_t local_param_bytes() const { return plan_.local_param_bytes(); }
  ShardMemory memory() const;
  // Unit indices (into plan().units) in the order the last forward ran them through run_unit.
  const std::vector<size_t>& unit_order() const;

  // WrappedModel. layouts(): every parameter's layout under each of its names, over mesh {world}
  // at coordinate {rank} (refused between a forward and its backward: require_between_steps).
  // reshard(): back to shards without reducing (after a forward whose backward never runs).
  // The comm hook (register_comm_hook) also handles GradBucket::reduce_scatter; the optimizer in
  // backward (set_optimizer_in_backward) steps each shard at the end of backward, after every
  // reduce-scatter finished (parameters move back to their shards only then: [Note: releasing
  // without set_]), DEFAULT's replicated parameters inside backward as under DDP. The bucket plan:
  // the units in launch order (the reverse of the forward's unit order), then DEFAULT's
  // replicated buckets.
  const layout::TensorLayouts& layouts() const override;
  // Hybrid: groups {replicate, shard} over mesh {R, S}, the mesh group group().
  comm::Sharding sharding() const override;
  void reshard() override;
  std::string plan_summary() const override;
  std::string plan_table() const override { return unit_table(); }
  int64_t peak_gathered_bytes() const override;
  GatheredBytes peak_gathered_by_owner() const override;
  void reset_peak_memory() override;

 protected:
  // The forward protocol (wrap/wrapped_model.hpp). pre_forward: gathers what run_unit will not.
  // cast_input: a floating-point input in param_dtype. end_forward: with grad mode off (an
  // evaluation forward) every unit goes back to its shards at once; with it on, the replicated
  // parameters' reducer is prepared. attach_start_backward: a node on each output starts the
  // backward's bookkeeping (prefetching the last unit) when a gradient reaches it, whichever output
  // backward starts from.
  void pre_forward() override;
  at::Tensor cast_input(const at::Tensor& input) const override;
  void end_forward(const std::vector<at::Tensor>& outputs) override;
  at::Tensor attach_start_backward(const at::Tensor& output) override;
  std::vector<std::pair<std::string, std::string>> describe_options() const override;
  // An Evaluation (wrap/evaluation.hpp): every unit gathered until its end, then resharded.
  void begin_evaluation() override;
  void end_evaluation() override;

 private:
  // What the runtime is doing; checked where a step moves on. kForward lasts from a forward under
  // grad mode to its backward: [Note: a forward whose backward never runs]. kEvaluation: an
  // Evaluation is open and every unit is gathered.
  enum class Phase { kIdle, kForward, kBackward, kEvaluation };

  // Both public constructors: `world` is group() (every rank of the model), the parameters are
  // sharded over `shard` (the same group when flat) and replicated across `replicate` (null when
  // flat).
  ShardedModule(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr world,
                comm::ProcessGroupPtr shard, comm::ProcessGroupPtr replicate, ShardOptions options);

  const char* kind() const override { return "sharded data-parallel"; }
  at::Tensor before_unit_forward(size_t unit, const at::Tensor& input) override;
  at::Tensor after_unit_forward(size_t unit, const at::Tensor& output) override;
  void before_unit_backward(size_t unit);
  void start_backward();
  // What the units' gradient path tells the schedule (through observer_).
  void unit_done(size_t group);
  void finish_backward();
  void warn_units_not_run() const;
  void check_reduce_dtype(c10::ScalarType dtype, bool from_param_dtype);

  ShardOptions options_;
  comm::ProcessGroupPtr shard_group_;      // the flat groups' and the schedule's; never null
  comm::ProcessGroupPtr replicate_group_;  // null unless hybrid
  std::vector<at::Tensor> params_;         // distinct, registration order; parallel to plan_.shapes
  std::vector<std::string> names_;         // their qualified names
  ShardPlan plan_;
  layout::TensorLayouts layouts_;  // plan_ as layouts, made with it (neither changes afterwards)
  // Gathers, prefetches and releases of the units' parameters (owns their flat groups).
  std::unique_ptr<UnitSchedule> schedule_;
  // The gradient path's gradients::UnitObserver (internal, gradients/unit_storage.hpp): forwards
  // to start_backward and unit_done. Made with the runtime; never null after the constructor.
  struct Observer;
  std::unique_ptr<Observer> observer_;
  std::vector<std::unique_ptr<unit::UnitRegistration>> registrations_;

  Phase phase_ = Phase::kIdle;
  bool finish_queued_ = false;  // the end-of-backward callback of this backward is queued
};

// The wrapper a training loop holds: the module (a holder, a shared_ptr to an Impl, or an
// AnyModule, as DistributedDataParallel takes) with ShardedModule's protocol around its forward.
// Any output structure is returned as it came (tensor, vector, pair, tuple), every tensor in it
// carrying the node that starts the backward's bookkeeping.
template <typename ModuleType>
class FullyShardedDataParallel
    : public ShardedModule,
      public wrap::TypedModule<ModuleType, FullyShardedDataParallel<ModuleType>> {
 public:
  FullyShardedDataParallel(ModuleType module, comm::ProcessGroupPtr group,
                           ShardOptions options = {})
      : ShardedModule(intake::as_module_ptr(module), std::move(group), std::move(options)),
        wrap::TypedModule<ModuleType, FullyShardedDataParallel>(module) {}

  // The runtime of the forward protocol (wrap/typed_module.hpp): this wrapper itself.
  wrap::WrappedModel& wrapped() { return *this; }
};

}  // namespace ddp::shard
