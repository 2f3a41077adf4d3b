#pragma once
// WrappedModel: what every data-parallel wrapper is, written once (Megatron's _BaseDataParallel in
// C++): the module and its data-parallel group, the gradient runtime that reduces its gradients
// (gradients/gradient_runtime.hpp), the stats listening to it, the optimizer stepping inside
// backward, no_sync, zero_grad, the comm hook, the runtime stats and the bucket plan.
// DistributedDataParallel (parallel/) and ShardedModule (shard/) derive from it and add their
// forward protocol and what only their style has; DataParallel<M> runs its forward through this
// base, so a training loop or a tool never asks which style it holds.
//
//   forward protocol (protected; WrappedForward drives it around the module's own forward):
//     pre_forward  ->  the module's forward on cast_input(args)  ->  end_forward(outputs)
//     -> every output tensor through attach_start_backward
//   DDP: prepare the buckets, walk the graph when asked; the sharded styles: gather what run_unit
//   will not, cast inputs to param_dtype, put a node on each output that starts the backward's
//   bookkeeping.
//
// Profiler ranges (torch's RecordFunction, USER_SCOPE: Kineto, Nsight via NVTX, torch.profiler)
// name the runtime's phases: ddp::pre_forward, ddp::post_forward, ddp::reduce_bucket (a bucket's
// reduction launched), ddp::finish_backward (the end of backward's wait and write-back),
// ddp::gather_unit (a sharded unit's all-gather) and ddp::optimizer_in_backward.

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/gradients/no_sync_guard.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/intake/module_call.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/obs/gradient_stats.hpp"
#include "ddp/obs/runtime_stats.hpp"
#include "ddp/optim/optimizer_in_backward.hpp"
#include "ddp/wrap/gathered_bytes.hpp"

namespace ddp::gradients {
class GradientRuntime;
}  // namespace ddp::gradients

namespace ddp::wrap {

class Evaluation;

class WrappedModel {
 public:
  virtual ~WrappedModel();
  WrappedModel(const WrappedModel&) = delete;
  WrappedModel& operator=(const WrappedModel&) = delete;

  // Scoped: backwards inside communicate nothing and the gradients accumulate locally; the next
  // synchronized backward reduces the accumulated sum.
  using NoSyncGuard = gradients::NoSyncGuard;
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(require_sync_); }

  // The data-parallel group and the wrapped module.
  const comm::ProcessGroupPtr& group() const { return pg_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }

  // Replaces the built-in average of every bucket (DDP's all-reduced ones, the sharded units'
  // reduce-scattered ones) by `hook` (hooks/default_hooks.hpp, hooks/powersgd_hook.hpp, or your
  // own). Once, before the first backward.
  void register_comm_hook(hooks::CommHookPtr hook);
  // Each parameter's optimizer (made by `factory` from the parameter, a shard under the sharded
  // styles) steps as soon as its gradient is reduced, inside backward. Once, before the first
  // backward; then do not call step() on an optimizer of your own.
  void set_optimizer_in_backward(const optim::ParamOptimizerFactory& factory);
  // Zeroes every gradient the runtime reduces, in place (DDP's bucket views, the shards'). Not
  // while a backward runs.
  void zero_grad();
  // The scope of an evaluation (wrap/evaluation.hpp, which defines it): eval mode, no grad, rank
  // 0's buffers, the parameters whole. Collective.
  [[nodiscard]] Evaluation evaluation();
  // Broadcasts rank 0's buffers (BatchNorm's running statistics, ...) to every rank, in one
  // coalesced collective: what every style's forward does first when its options'
  // broadcast_buffers is set (DDPOptions, ShardOptions). Collective.
  void sync_buffers() { sync_buffers_for(ForwardKind::kTraining); }

  // Runtime stats and configuration (PyTorch's _get_ddp_logging_data), and the last synchronized
  // backward's timeline.
  obs::LoggingData logging_data();
  obs::IterationTimeline last_timeline() const;
  // Every bucket the runtime reduces, in launch order; the table the timeline's bucket indices
  // refer to. Empty when nothing is reduced.
  const buckets::BucketPlan& bucket_plan() const;
  int64_t num_synchronized_backwards() const;

  // What this rank holds of each parameter over the data-parallel group (mesh {world}): none
  // named under DDP (whole on every rank), the shard plan's under the sharded styles. Refused
  // while a forward's parameters are gathered ([Note: a forward whose backward never runs]).
  virtual const layout::TensorLayouts& layouts() const = 0;
  // The layouts with the group they are over (comm/sharding/sharding.hpp): mesh {world} over
  // group(). What the gradient norm and the export take, whichever style answers.
  virtual comm::Sharding sharding() const;
  // After a forward under grad mode whose backward never runs: back to the state before it (the
  // sharded styles put every unit back on its shards; DDP has nothing to undo). Between steps.
  virtual void reshard() = 0;
  // One line for people: "3 buckets", "4 units (fully_shard)"; and the table behind it (the
  // bucket table, the unit table).
  virtual std::string plan_summary() const = 0;
  virtual std::string plan_table() const = 0;
  // The most bytes gathered at once since reset_peak_memory(), in total and by owner.
  virtual int64_t peak_gathered_bytes() const { return 0; }
  virtual GatheredBytes peak_gathered_by_owner() const { return {}; }
  virtual void reset_peak_memory() {}

 protected:
  // `stats_every`: the stats' sampling (DDPOptions::stats_every, ShardOptions::stats_every).
  WrappedModel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr group,
               int64_t stats_every, const char* wrapper);

  // The runtime reducing this model's gradients (null: nothing to reduce), once, from the
  // derived constructor; the stats listen to it from then on.
  void set_gradients(std::unique_ptr<gradients::GradientRuntime> gradients);
  // What a forward through the wrapper is, which every rank must agree on: [Note: the forward's
  // kind] in wrapped_model.cpp.
  enum class ForwardKind { kTraining = 1, kEvaluation = 2, kEvaluationScope = 3 };
  // sync_buffers for a forward of `kind`: on a CPU group the kind rides in the same broadcast
  // and a rank whose kind differs from rank 0's throws naming both.
  void sync_buffers_for(ForwardKind kind);
  // The buffers sync_buffers broadcasts (the module's, less any ignored), once, from the derived
  // constructor.
  void set_buffers(std::vector<at::Tensor> buffers) { buffers_ = std::move(buffers); }
  const std::vector<at::Tensor>& buffers() const { return buffers_; }
  gradients::GradientRuntime* gradients() const { return gradients_.get(); }
  // Drops the gradient runtime (its autograd hooks) first, from a derived destructor, before the
  // derived members its hooks and observers use.
  void drop_gradients();
  obs::GradientStats& stats() { return stats_; }
  const obs::GradientStats& stats() const { return stats_; }
  bool require_sync() const { return require_sync_; }

  // The forward protocol (the header comment). `outputs`: every tensor the forward returned.
  virtual void pre_forward() = 0;
  virtual at::Tensor cast_input(const at::Tensor& input) const { return input; }
  virtual void end_forward(const std::vector<at::Tensor>& outputs) = 0;
  virtual at::Tensor attach_start_backward(const at::Tensor& output) { return output; }
  // The style's options, as (dotted name, value), for logging_data.
  virtual std::vector<std::pair<std::string, std::string>> describe_options() const = 0;
  // An Evaluation (wrap/evaluation.hpp) opens and closes: the style makes the module whole and
  // every rank's buffers rank 0's, then puts its shards back. Collective where they communicate.
  virtual void begin_evaluation() = 0;
  virtual void end_evaluation() {}

 private:
  friend class WrappedForward;
  friend class Evaluation;

  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroupPtr pg_;
  bool require_sync_ = true;         // false inside no_sync()
  std::vector<at::Tensor> buffers_;  // what sync_buffers broadcasts
  bool evaluating_ = false;          // an Evaluation is open: forwards run the module alone
  // Listeners on the gradient runtime; declared before it so they outlive it.
  obs::GradientStats stats_;
  std::unique_ptr<optim::OptimizerInBackward> optimizer_in_backward_;
  std::unique_ptr<gradients::GradientRuntime> gradients_;
};

// The forward protocol around a module's own forward, for the typed wrappers
// (DistributedDataParallel<M>, FullyShardedDataParallel<M>, DataParallel<M>, through
// wrap/typed_module.hpp): any signature, any
// output structure returned as it came (tensor, vector, pair, tuple), each tensor in it through
// attach_start_backward.
class WrappedForward {
 public:
  template <typename ModuleType, typename... Args>
  static auto run(WrappedModel& model, ModuleType& module, Args&&... args) {
    if (model.evaluating_) {
      // Inside an Evaluation everything the forward needs is in place (whole parameters, rank
      // 0's buffers): the module's own forward, nothing communicated.
      auto output = intake::call_forward(module, cast(model, std::forward<Args>(args))...);
      auto same = [](const at::Tensor& t) { return t; };
      return intake::map_tensors(output, same);
    }
    {
      RECORD_USER_SCOPE("ddp::pre_forward");
      model.pre_forward();
    }
    auto output = intake::call_forward(module, cast(model, std::forward<Args>(args))...);
    std::vector<at::Tensor> tensors;
    intake::collect(output, tensors);
    RECORD_USER_SCOPE("ddp::post_forward");
    model.end_forward(tensors);
    auto start = [&model](const at::Tensor& t) { return model.attach_start_backward(t); };
    return intake::map_tensors(output, start);
  }

 private:
  template <typename Arg>
  static decltype(auto) cast(const WrappedModel& model, Arg&& arg) {
    if constexpr (std::is_same_v<std::decay_t<Arg>, at::Tensor>) {
      return model.cast_input(arg);
    } else {
      return std::forward<Arg>(arg);
    }
  }
};

}  // namespace ddp::wrap
