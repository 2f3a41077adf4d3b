#include "ddp/parallel/grad_clip.hpp"

#include "ddp/layout/tensor_layouts.hpp"

namespace ddp::parallel {

optim::GradShards split_grad_shards(torch::nn::Module& module, const shard::ShardedModule* sharded,
                                    const tp::TensorParallel* tp,
                                    const comm::ProcessGroupPtr& dp_group) {
  if (tp == nullptr) {
    if (sharded == nullptr) return optim::grad_shards(module);  // DDP: whole everywhere
    const layout::TensorLayouts layouts = sharded->layouts();
    return optim::grad_shards(module, &layouts, {sharded->group()});
  }
  if (sharded == nullptr && !dp_group)
    return optim::grad_shards(module, &tp->layouts(), {tp->group()});
  // The mesh {dp, tp}: the data-parallel runtime's layouts outside, TP's inside (io/checkpoint.hpp
  // describes the same nesting for checkpoints).
  const comm::ProcessGroupPtr& outer = sharded != nullptr ? sharded->group() : dp_group;
  const layout::TensorLayouts dp_layouts =
      sharded != nullptr ? sharded->layouts()
                         : layout::replicated_over({outer->world_size()}, {outer->rank()});
  const layout::TensorLayouts layouts = layout::nest(tp->layouts(), dp_layouts);
  return optim::grad_shards(module, &layouts, {outer, tp->group()});
}

optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 double max_norm) {
  optim::ClipOptions options;
  options.max_norm = max_norm;
  return optim::clip_grad_norm(split_grad_shards(module, nullptr, &tp, nullptr), options);
}

}  // namespace ddp::parallel
