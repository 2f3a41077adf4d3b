#pragma once
// ddp::data_parallel(module, group or mesh, style, options): the seed's entry point
// (torch/distributed/_spmd/data_parallel.py's styles) in one call. It picks the runtime for the
// style and returns one wrapper type, so a training loop is written once for every style:
//
//   auto model = ddp::data_parallel(net, group, ddp::DataParallelStyle::kFullyShard);
//   torch::optim::AdamW opt(net->parameters(), ...);   // after wrapping: sees the shards
//   loss(model(x), y).backward(); opt.step(); opt.zero_grad();
//
//   kReplicate   DistributedDataParallel (every rank holds the model; buckets all-reduced)
//   kFullyShard  shard::FullyShardedDataParallel (every parameter sharded on dim 0)
//   kDefault     shard::FullyShardedDataParallel with the DEFAULT plan (dim 0 divisible: sharded,
//                else replicated through the reducer)
// With a DeviceMesh the data-parallel group is the mesh dim named "dp", or the only dim of a 1-D
// mesh.
//
// One interface for every style: the calls below (layouts, comm hook, optimizer in backward,
// zero_grad, no_sync, stats) answer alike whichever runtime is behind, so a training loop or a
// tool never asks which style it runs.

#include <memory>
#include <string>
#include <utility>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/data_parallel_style.hpp"
#include "ddp/shard/sharded_module.hpp"

namespace ddp::tp {
class TensorParallel;
}

namespace ddp::parallel {

using shard::DataParallelStyle;

// A data-parallel runtime's layouts `dp` (over mesh {dp}) under tensor parallelism: tp's split
// inside, `dp`'s outside, over the mesh {dp, tp}. The one place the DP x TP nesting is written
// (checkpoints, the whole-weights export and the gradient clip read it).
layout::TensorLayouts over_tensor_parallel(const layout::TensorLayouts& dp,
                                           const tp::TensorParallel& tp);

// The refusal of DataParallelOptions::shard.style set to another style than the call's; "" when
// they agree (or shard.style is left at its default).
std::string style_conflict(DataParallelStyle style, DataParallelStyle in_options);

// The options of every style, composed: the call's style says which part is used.
struct DataParallelOptions {
  // kReplicate's (buckets, hooks, unused parameters, ...; defaults as DistributedDataParallel).
  DDPOptions ddp;
  // kFullyShard's and kDefault's (units, reshard_after_forward, prefetch, the replicated
  // parameters' reducer); its `style` field is set from the call's style (another style set here
  // is refused by name: the call's argument decides).
  shard::ShardOptions shard;
};

// The data-parallel group of `mesh`: dim "dp", or the only dim. Throws naming the mesh's dims.
comm::ProcessGroupPtr data_parallel_group(const comm::DeviceMesh& mesh);

template <typename ModuleType>
class DataParallel {
 public:
  DataParallel(ModuleType module, comm::ProcessGroupPtr group, DataParallelStyle style,
               DataParallelOptions options = {})
      : style_(style) {
    const std::string conflict = style_conflict(style, options.shard.style);
    TORCH_CHECK(conflict.empty(), conflict);
    TORCH_CHECK(group, "ddp::data_parallel needs a process group");
    if (style == DataParallelStyle::kReplicate) {
      replicated_layouts_ = layout::replicated_over({group->world_size()}, {group->rank()});
      replicated_ = std::make_unique<DistributedDataParallel<ModuleType>>(
          std::move(module), std::move(group), std::move(options.ddp));
    } else {
      options.shard.style = style;
      sharded_ = std::make_unique<shard::FullyShardedDataParallel<ModuleType>>(
          std::move(module), std::move(group), std::move(options.shard));
    }
  }

  template <typename... Args>
  auto forward(Args&&... args) {
    if (replicated_) return replicated_->forward(std::forward<Args>(args)...);
    return sharded_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // As DistributedDataParallel::no_sync, for every style.
  [[nodiscard]] reducer::NoSyncGuard no_sync() {
    return replicated_ ? replicated_->no_sync() : sharded_->no_sync();
  }

  DataParallelStyle style() const { return style_; }
  // The data-parallel group and the wrapped module.
  const comm::ProcessGroupPtr& group() const {
    return replicated_ ? replicated_->group() : sharded_->group();
  }
  std::shared_ptr<torch::nn::Module> module_ptr() const {
    return replicated_ ? replicated_->module_ptr() : sharded_->module_ptr();
  }
  // What this rank holds of each parameter, over the data-parallel group (mesh {world}): under
  // kReplicate no parameter is named (whole on every rank), under the sharded styles the shard
  // plan's. What io::TrainingState::layouts, io::whole_state and the gradient clip read.
  const layout::TensorLayouts& layouts() const {
    if (sharded_) sharded_->require_between_steps("layouts");
    return sharded_ ? sharded_->layouts() : replicated_layouts_;
  }
  // The same over tensor parallelism (mesh {dp, tp}): over_tensor_parallel(layouts(), tp).
  layout::TensorLayouts layouts(const tp::TensorParallel& tp) const {
    return over_tensor_parallel(layouts(), tp);
  }
  // The gradient reduction's comm hook: DDP's buckets and the sharded units' reduce-scatters
  // (DistributedDataParallel::register_comm_hook, ShardedModule::register_comm_hook).
  void register_comm_hook(hooks::CommHookPtr hook) {
    if (replicated_) {
      replicated_->register_comm_hook(std::move(hook));
    } else {
      sharded_->register_comm_hook(hook);
    }
  }
  // Each parameter's optimizer step inside backward, once its gradient is reduced.
  void set_optimizer_in_backward(const optim::ParamOptimizerFactory& factory) {
    if (replicated_) {
      replicated_->set_optimizer_in_backward(factory);
    } else {
      sharded_->set_optimizer_in_backward(factory);
    }
  }
  // After a forward with grad mode on whose backward never runs (an evaluation without
  // torch::NoGradGuard): the sharded styles put every unit back on its shards and drop what that
  // forward prepared (ShardedModule::reshard), so that training goes on as if it never ran; DDP
  // has nothing to undo. Between steps.
  void reshard() {
    if (sharded_) sharded_->reshard();
  }
  // Zeroes the gradients the runtime owns (DDP's bucket views, the sharded styles' shards).
  void zero_grad() {
    if (replicated_) {
      replicated_->zero_grad();
    } else {
      sharded_->zero_grad();
    }
  }
  // Runtime stats and configuration (PyTorch's _get_ddp_logging_data), and the timeline of the
  // last synchronized backward.
  obs::LoggingData logging_data() {
    return replicated_ ? replicated_->logging_data() : sharded_->logging_data();
  }
  obs::IterationTimeline last_timeline() const {
    return replicated_ ? replicated_->last_timeline() : sharded_->last_timeline();
  }
  // The runtime behind the style (the other is null): for what only one style has (the bucket
  // table, the unit table, memory, full_parameters).
  DistributedDataParallel<ModuleType>* replicated() { return replicated_.get(); }
  shard::FullyShardedDataParallel<ModuleType>* sharded() { return sharded_.get(); }

 private:
  DataParallelStyle style_;
  // kReplicate's layouts (no parameter named: whole on every rank); the sharded styles answer with
  // their runtime's.
  layout::TensorLayouts replicated_layouts_;
  std::unique_ptr<DistributedDataParallel<ModuleType>> replicated_;
  std::unique_ptr<shard::FullyShardedDataParallel<ModuleType>> sharded_;
};

template <typename ModuleType>
DataParallel<ModuleType> data_parallel(ModuleType module, comm::ProcessGroupPtr group,
                                       DataParallelStyle style, DataParallelOptions options = {}) {
  return DataParallel<ModuleType>(std::move(module), std::move(group), style, std::move(options));
}

template <typename ModuleType>
DataParallel<ModuleType> data_parallel(ModuleType module, const comm::DeviceMesh& mesh,
                                       DataParallelStyle style, DataParallelOptions options = {}) {
  return DataParallel<ModuleType>(std::move(module), data_parallel_group(mesh), style,
                                  std::move(options));
}

}  // namespace ddp::parallel

namespace ddp {
using parallel::data_parallel;
using parallel::DataParallel;
using parallel::DataParallelOptions;
using shard::DataParallelStyle;
}  // namespace ddp
