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
// mesh; a 2-D mesh with dims ("replicate", "shard") makes the sharded styles hybrid (shard within
// "shard", replicate across "replicate": shard/sharded_module.hpp) and kReplicate DDP over the
// whole mesh. A mesh with more dims beside those two (("replicate", "shard", "tp"), tensor
// parallelism on "tp") is hybrid over the ranks that share this rank's other coordinates
// (comm::submesh); over_tensor_parallel nests its layouts on tp's when "tp" is the last dim.
//
// One interface for every style: the calls below (layouts, comm hook, optimizer in backward,
// zero_grad, no_sync, stats) and wrapped() (the plan, memory) answer alike whichever runtime is
// behind (wrap::WrappedModel, the base of both), so a training loop or a tool never asks which
// style it runs.

#include <memory>
#include <string>
#include <utility>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/shard/data_parallel_style.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/wrap/evaluation.hpp"
#include "ddp/wrap/typed_module.hpp"
#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::tp {
class TensorParallel;
}

namespace ddp::parallel {

using shard::DataParallelStyle;

// A data-parallel runtime's sharding `dp` (over mesh {dp}; hybrid: {replicate, shard}) under
// tensor parallelism: tp's split inside, `dp`'s outside, over the mesh {dp, tp} with the groups
// {dp, tp} (hybrid: {replicate, shard, tp}); `mesh_group` that
// mesh's group (DeviceMesh::parent(): what an export gathers over; null leaves the sharding good
// for a gradient norm only). The one place the DP x TP nesting is written (checkpoints, the
// whole-weights export and the gradient clip read it).
comm::Sharding over_tensor_parallel(const comm::Sharding& dp, const tp::TensorParallel& tp,
                                    comm::ProcessGroupPtr mesh_group = nullptr);

// The refusal of DataParallelOptions::shard.style set to another style than the call's; "" when
// they agree (or shard.style is left at its default).
std::string style_conflict(DataParallelStyle style, DataParallelStyle in_options);

// The refusal of a gather-side setting (shard.param_dtype, shard.reduce_dtype) under kReplicate,
// which gathers and reduce-scatters nothing, so the setting would be silently ignored; "" when the
// style is sharded or neither is set.
std::string gather_setting_conflict(DataParallelStyle style, const shard::ShardOptions& shard);

// The options of every style, composed: the call's style says which part is used.
struct DataParallelOptions {
  // kReplicate's (buckets, hooks, unused parameters, ...; defaults as DistributedDataParallel).
  DDPOptions ddp;
  // kFullyShard's and kDefault's (units, reshard_after_forward, prefetch, the replicated
  // parameters' reducer); its `style` field is set from the call's style (another style set here
  // is refused by name: the call's argument decides).
  shard::ShardOptions shard;
};

// The refusal of broadcast_buffers turned off in the struct the call's style does not read
// (ddp.broadcast_buffers under a sharded style, shard.broadcast_buffers under kReplicate), which
// would be silently ignored; "" otherwise.
std::string buffer_setting_conflict(DataParallelStyle style, const DataParallelOptions& options);

// The data-parallel group of `mesh`: dim "dp", or the only dim. Throws naming the mesh's dims.
comm::ProcessGroupPtr data_parallel_group(const comm::DeviceMesh& mesh);

// The runtime of `style` around `module` over `group`: DistributedDataParallel for kReplicate,
// ShardedModule for the sharded styles. The one place a style picks its runtime.
std::unique_ptr<wrap::WrappedModel> make_wrapped(std::shared_ptr<torch::nn::Module> module,
                                                 comm::ProcessGroupPtr group,
                                                 DataParallelStyle style,
                                                 DataParallelOptions options);

// The same over `mesh`: hybrid sharding over dims ("replicate", "shard"), else make_wrapped over
// data_parallel_group(mesh).
std::unique_ptr<wrap::WrappedModel> make_wrapped(std::shared_ptr<torch::nn::Module> module,
                                                 const comm::DeviceMesh& mesh,
                                                 DataParallelStyle style,
                                                 DataParallelOptions options);

template <typename ModuleType>
class DataParallel : public wrap::TypedModule<ModuleType, DataParallel<ModuleType>> {
 public:
  // forward, operator() and module() (wrap/typed_module.hpp): the module's own forward, inside
  // the style's forward protocol.
  DataParallel(ModuleType module, comm::ProcessGroupPtr group, DataParallelStyle style,
               DataParallelOptions options = {})
      : wrap::TypedModule<ModuleType, DataParallel>(module),
        style_(style),
        wrapped_(make_wrapped(intake::as_module_ptr(module), std::move(group), style,
                              std::move(options))) {}
  DataParallel(ModuleType module, const comm::DeviceMesh& mesh, DataParallelStyle style,
               DataParallelOptions options = {})
      : wrap::TypedModule<ModuleType, DataParallel>(module),
        style_(style),
        wrapped_(make_wrapped(intake::as_module_ptr(module), mesh, style, std::move(options))) {}

  DataParallelStyle style() const { return style_; }
  // The runtime behind the style, as every style's base: what a training loop or a tool asks
  // (wrap/wrapped_model.hpp: the plan, the stats, memory), whichever style it holds.
  wrap::WrappedModel& wrapped() { return *wrapped_; }
  const wrap::WrappedModel& wrapped() const { return *wrapped_; }

  // The scope of an evaluation, every style (wrap/evaluation.hpp): eval mode, no grad, rank 0's
  // buffers, every unit gathered; the module itself and the wrapper compute whole. Collective.
  [[nodiscard]] wrap::Evaluation evaluation() { return wrapped_->evaluation(); }
  // As DistributedDataParallel::no_sync, for every style.
  [[nodiscard]] wrap::WrappedModel::NoSyncGuard no_sync() { return wrapped_->no_sync(); }
  // The data-parallel group and the wrapped module.
  const comm::ProcessGroupPtr& group() const { return wrapped_->group(); }
  std::shared_ptr<torch::nn::Module> module_ptr() const { return wrapped_->module_ptr(); }
  // What this rank holds of each parameter, over the data-parallel group (mesh {world}): under
  // kReplicate no parameter is named (whole on every rank), under the sharded styles the shard
  // plan's. What the gradient clip reads (checkpoints and the export take sharding()).
  const layout::TensorLayouts& layouts() const { return wrapped_->layouts(); }
  // The same over tensor parallelism (mesh {dp, tp}): over_tensor_parallel's.
  layout::TensorLayouts layouts(const tp::TensorParallel& tp) const { return sharding(tp).layouts; }
  // The layouts with their groups (comm/sharding/sharding.hpp): what clip_grad_norm and
  // io::whole_state take, the same call for every style. Over tensor parallelism the groups {dp,
  // tp}, and `mesh_group` the mesh's parent (an export needs it; a norm does not).
  comm::Sharding sharding() const { return wrapped_->sharding(); }
  comm::Sharding sharding(const tp::TensorParallel& tp,
                          comm::ProcessGroupPtr mesh_group = nullptr) const {
    return over_tensor_parallel(sharding(), tp, std::move(mesh_group));
  }
  // The gradient reduction's comm hook: DDP's buckets and the sharded units' reduce-scatters.
  void register_comm_hook(hooks::CommHookPtr hook) {
    wrapped_->register_comm_hook(std::move(hook));
  }
  // Each parameter's optimizer step inside backward, once its gradient is reduced.
  void set_optimizer_in_backward(const optim::ParamOptimizerFactory& factory) {
    wrapped_->set_optimizer_in_backward(factory);
  }
  // After a forward with grad mode on whose backward never runs (an evaluation without
  // torch::NoGradGuard): the sharded styles put every unit back on its shards and drop what that
  // forward prepared, so that training goes on as if it never ran; DDP has nothing to undo.
  // Between steps.
  void reshard() { wrapped_->reshard(); }
  // Zeroes the gradients the runtime owns (DDP's bucket views, the sharded styles' shards).
  void zero_grad() { wrapped_->zero_grad(); }
  // Runtime stats and configuration (PyTorch's _get_ddp_logging_data), and the timeline of the
  // last synchronized backward.
  obs::LoggingData logging_data() { return wrapped_->logging_data(); }
  obs::IterationTimeline last_timeline() const { return wrapped_->last_timeline(); }

 private:
  DataParallelStyle style_;
  std::unique_ptr<wrap::WrappedModel> wrapped_;
};

template <typename ModuleType>
DataParallel<ModuleType> data_parallel(ModuleType module, comm::ProcessGroupPtr group,
                                       DataParallelStyle style, DataParallelOptions options = {}) {
  return DataParallel<ModuleType>(std::move(module), std::move(group), style, std::move(options));
}

template <typename ModuleType>
DataParallel<ModuleType> data_parallel(ModuleType module, const comm::DeviceMesh& mesh,
                                       DataParallelStyle style, DataParallelOptions options = {}) {
  return DataParallel<ModuleType>(std::move(module), mesh, style, std::move(options));
}

}  // namespace ddp::parallel

namespace ddp {
using parallel::data_parallel;
using parallel::DataParallel;
using parallel::DataParallelOptions;
using shard::DataParallelStyle;
}  // namespace ddp
