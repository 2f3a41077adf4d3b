#include "ddp/shard/sharded_module.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <unordered_set>

#include "ddp/comm/broadcast_coalesced.hpp"

namespace ddp::shard {

ShardedModule::ShardedModule(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr group,
                             ShardOptions options)
    : module_(std::move(module)), pg_(std::move(group)), options_(std::move(options)) {
  TORCH_CHECK(module_, "ddp: ShardedModule needs a module");
  TORCH_CHECK(pg_, "ddp: ShardedModule needs a process group");
  TORCH_CHECK(options_.style != DataParallelStyle::kReplicate,
              "ddp: style replicate is DistributedDataParallel's; ShardedModule takes "
              "fully_shard or default");
  // Tied weights are registered under several names: the first name wins, as in DDP.
  std::vector<ParamShape> shapes;
  std::vector<std::string> names;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    params_.push_back(item.value());
    names.push_back(item.key());
    shapes.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  // Every rank starts from rank 0's values, before they are split.
  comm::broadcast_coalesced(*pg_, params_, 0, "broadcast of rank 0's parameters");
  plan_ = plan_shards(shapes, options_.units, pg_->world_size(), options_.style);
  for (size_t u = 0; u < plan_.units.size(); ++u) {
    bool any_sharded = false;
    for (size_t i : plan_.units[u].params) {
      any_sharded |= plan_.params[i].placement == Placement::kShard;
    }
    if (any_sharded) groups_.push_back(std::make_unique<FlatParamGroup>(plan_, u, params_, pg_));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (plan_.params[i].placement == Placement::kReplicate) replicated_.push_back(i);
  }
  names_ = std::move(names);
}

void ShardedModule::pre_forward() {
  for (auto& group : groups_) group->unshard();
  // [Note: accumulators follow the storage] Switching a parameter's storage with set_() drops its
  // cached gradient accumulator, and an accumulator records the parameter's shape when it is
  // made: hooks installed on the sharded parameters would sit on nodes the next backward never
  // runs. So they are installed here, on the full parameters the forward is about to use (the
  // old ones are removed first). Cost: one post-hook per parameter per forward.
  hooks_.reset();
  hooks_ = std::make_unique<reducer::AutogradHooks>(params_, names_,
                                                    [this](size_t) { on_grad_ready(); });
}

void ShardedModule::reshard() {
  for (auto& group : groups_) group->reshard();
}

void ShardedModule::on_grad_ready() {
  if (finish_queued_ || !require_sync_) return;
  finish_queued_ = true;
  reducer::AutogradHooks::at_end_of_backward([this] { finish_backward(); });
}

void ShardedModule::finish_backward() {
  finish_queued_ = false;
  for (auto& group : groups_) group->reduce_scatter_grads();
  if (replicated_.empty()) return;
  // One flat all-reduce of the replicated gradients (a missing gradient counts as zeros).
  std::vector<at::Tensor> flat;
  for (size_t i : replicated_) {
    const at::Tensor& g = params_[i].grad();
    flat.push_back(g.defined() ? g.reshape({-1})
                               : at::zeros({params_[i].numel()}, params_[i].options()));
  }
  at::Tensor all = at::cat(flat);
  pg_->wait(pg_->allreduce_avg_async(all), "all-reduce of the replicated gradients");
  int64_t offset = 0;
  at::NoGradGuard no_grad;
  for (size_t i : replicated_) {
    const int64_t n = params_[i].numel();
    at::Tensor averaged = all.narrow(0, offset, n).view(params_[i].sizes());
    if (params_[i].grad().defined()) {
      params_[i].mutable_grad().copy_(averaged);
    } else {
      params_[i].mutable_grad() = averaged.clone();
    }
    offset += n;
  }
}

}  // namespace ddp::shard
