#include "ddp/parallel/grad_clip.hpp"

#include "ddp/layout/tensor_layouts.hpp"

namespace ddp::parallel {

optim::GradShards split_grad_shards(torch::nn::Module& module, const shard::ShardedModule* sharded,
                                    const tp::TensorParallel* tp,
                                    const comm::ProcessGroupPtr& dp_group) {
  if (tp == nullptr) {
    if (sharded == nullptr) return optim::grad_shards(module);  // DDP: whole everywhere
    return optim::grad_shards(module, &sharded->layouts(), {sharded->group()});
  }
  if (sharded == nullptr && !dp_group)
    return optim::grad_shards(module, &tp->layouts(), {tp->group()});
  const comm::ProcessGroupPtr& outer = sharded != nullptr ? sharded->group() : dp_group;
  const layout::TensorLayouts layouts = over_tensor_parallel(
      sharded != nullptr ? sharded->layouts()
                         : layout::replicated_over({outer->world_size()}, {outer->rank()}),
      *tp);
  return optim::grad_shards(module, &layouts, {outer, tp->group()});
}

optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 const optim::ClipOptions& options, int64_t step) {
  return optim::clip_grad_norm(split_grad_shards(module, nullptr, &tp, nullptr), options, step);
}

optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 double max_norm) {
  optim::ClipOptions options;
  options.max_norm = max_norm;
  return clip_grad_norm(module, tp, options);
}

}  // namespace ddp::parallel
