#pragma once
// clip_grad_norm(model, max_norm) for every style and mesh: the wrapper says how it splits the
// gradients (its layouts, nested on tensor parallelism's), and optim/grad_clip.hpp computes the
// norm of the whole gradients from them ([Note: a norm over layouts]).
//
//   loss.backward();
//   const auto clipped = ddp::clip_grad_norm(model, 1.0);            // DDP, FULLY_SHARD, DEFAULT
//   const auto clipped = ddp::clip_grad_norm(model, *tp, 1.0);       // DP x TP, FULLY_SHARD x TP
//   const auto clipped = ddp::clip_grad_norm(*net, *tp, 1.0);        // TP alone
//   if (!clipped.skipped()) opt.step();   // a host read; or opt.skip_when(clipped.nonfinite)
//
// Collectives: none for DDP; one over the dp group for the sharded styles; one over the tp group
// when TP splits something; both for FULLY_SHARD x TP. Every rank of the mesh must call it.

#include <torch/nn/module.h>

#include "ddp/optim/grad_clip.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/tp/parallelize.hpp"

namespace ddp::parallel {

// `module`'s gradients as `sharding` splits them (the wrapper's, tensor parallelism's, or the two
// nested: comm/sharding/sharding.hpp). `nests_tensor_parallel`: whether `sharding` includes tensor
// parallelism's split; a module split by it that is normed without it is refused by name.
optim::GradShards grad_shards(torch::nn::Module& module, const comm::Sharding& sharding,
                              bool nests_tensor_parallel);

// The wrapped model's gradients as this rank holds them, over `tp` too when given: the same call
// for every style (the wrapper answers its sharding).
template <typename ModuleType>
optim::GradShards grad_shards(DataParallel<ModuleType>& model,
                              const tp::TensorParallel* tp = nullptr) {
  if (tp == nullptr) return grad_shards(*model.module_ptr(), model.sharding(), false);
  return grad_shards(*model.module_ptr(), model.sharding(*tp), true);
}

template <typename ModuleType>
optim::ClipResult clip_grad_norm(DataParallel<ModuleType>& model, const optim::ClipOptions& options,
                                 int64_t step = -1) {
  return optim::clip_grad_norm(grad_shards(model), options, step);
}
template <typename ModuleType>
optim::ClipResult clip_grad_norm(DataParallel<ModuleType>& model, double max_norm) {
  optim::ClipOptions options;
  options.max_norm = max_norm;
  return clip_grad_norm(model, options);
}
// Over tensor parallelism: the mesh {dp, tp}; any ClipOptions (the infinity norm, the skip).
template <typename ModuleType>
optim::ClipResult clip_grad_norm(DataParallel<ModuleType>& model, const tp::TensorParallel& tp,
                                 const optim::ClipOptions& options, int64_t step = -1) {
  return optim::clip_grad_norm(grad_shards(model, &tp), options, step);
}
template <typename ModuleType>
optim::ClipResult clip_grad_norm(DataParallel<ModuleType>& model, const tp::TensorParallel& tp,
                                 double max_norm) {
  optim::ClipOptions options;
  options.max_norm = max_norm;
  return clip_grad_norm(model, tp, options);
}
// Tensor parallelism alone (no data-parallel wrapper): the norm over the tp group.
optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 const optim::ClipOptions& options, int64_t step = -1);
optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 double max_norm);

}  // namespace ddp::parallel

namespace ddp {
using parallel::clip_grad_norm;
}  // namespace ddp
