#pragma once
// ShardedModule: FULLY_SHARD and DEFAULT over a whole module, on top of the shard plan and one
// FlatParamGroup per unit. First version, correct for any module, without per-unit scheduling:
//
//   construction  rank 0's parameters are broadcast; the plan is made; every unit's sharded
//                 parameters move into its flat shard (the module now holds shards between steps)
//   pre_forward   every unit is unsharded (one all-gather each, in unit order)
//   backward      an accumulator post-hook notes the first gradient; at the end of the backward
//                 every unit reduce-scatters its averaged gradients into gradient shards and
//                 reshards, and the replicated parameters' gradients are averaged by one flat
//                 all-reduce
//   optimizer     steps on the shards (built after the wrapper: it sees the sharded parameters)
//
// [Note: why no per-unit schedule yet] The C++ frontend has no forward hooks on nn::Module, so
// nothing can run "before unit h.3's forward" for an arbitrary module: the whole model is gathered
// at the start of forward and stays gathered until the end of backward (FSDP's
// reshard_after_forward=false with one gather per unit). Memory between steps is sharded
// (parameters, gradients, optimizer state); the peak during a step is the full model.
// Per-unit resharding and prefetch need a unit wrapper in the model's forward (issue 12), and the
// replicated gradients of DEFAULT will move to the bucketed, overlapped reducer path.

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/reducer/autograd_hooks.hpp"
#include "ddp/reducer/no_sync_guard.hpp"
#include "ddp/shard/flat_param_group.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::shard {

struct ShardOptions {
  // kFullyShard (default: the style users ask for when a model does not fit) or kDefault;
  // kReplicate is DistributedDataParallel's job and is refused here.
  DataParallelStyle style = DataParallelStyle::kFullyShard;
  // Qualified submodule names, one unit each (e.g. every "h.N" block); empty: one unit, the root.
  // Default empty: correct for any model, one collective per step each way.
  std::vector<std::string> units;
};

class ShardedModule {
 public:
  ShardedModule(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr group,
                ShardOptions options = {});
  ShardedModule(const ShardedModule&) = delete;
  ShardedModule& operator=(const ShardedModule&) = delete;

  // Gathers every unit; call before the module's forward (the template wrapper does).
  void pre_forward();
  // Back to shards without reducing (after an evaluation forward).
  void reshard();

  // Scoped, as DistributedDataParallel::no_sync: backwards inside communicate nothing; the
  // parameters stay gathered and their full gradients accumulate locally, and the next
  // synchronized backward reduce-scatters (and all-reduces) the accumulated sum.
  using NoSyncGuard = reducer::NoSyncGuard;
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(require_sync_); }

  const ShardPlan& plan() const { return plan_; }
  std::string unit_table() const { return format_unit_table(plan_); }
  // Bytes of parameters this rank holds between steps (ShardPlan::local_param_bytes).
  int64_t local_param_bytes() const { return plan_.local_param_bytes(); }

 private:
  void on_grad_ready();
  void finish_backward();

  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroupPtr pg_;
  ShardOptions options_;
  std::vector<at::Tensor> params_;  // distinct, registration order; parallel to plan_.shapes
  std::vector<std::string> names_;  // their qualified names
  ShardPlan plan_;
  std::vector<std::unique_ptr<FlatParamGroup>> groups_;  // units with sharded parameters
  std::vector<size_t> replicated_;                       // plan indices, all-reduced
  std::unique_ptr<reducer::AutogradHooks> hooks_;
  bool finish_queued_ = false;  // the end-of-backward callback of this backward is queued
  bool require_sync_ = true;    // false inside no_sync(): backward reduces nothing
};

template <typename ModuleType>
class FullyShardedDataParallel : public ShardedModule {
 public:
  FullyShardedDataParallel(ModuleType module, comm::ProcessGroupPtr group,
                           ShardOptions options = {})
      : ShardedModule(module.ptr(), std::move(group), std::move(options)),
        module_(std::move(module)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    pre_forward();
    return module_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  ModuleType& module() { return module_; }

 private:
  ModuleType module_;
};

}  // namespace ddp::shard
