#include "ddp/parallel/grad_clip.hpp"

#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp::parallel {
namespace {

// A model tensor parallelism split, normed without its TensorParallel: each tp rank would norm
// only its own shards (a norm too small, a different one per tp rank, so that the replicated
// parameters drift apart), silently. Refused before any collective, naming the split submodule.
void refuse_split_without_tp(torch::nn::Module& module) {
  constexpr std::string_view kTp = tp::TensorParallel::kKind;
  if (!unit::any_unit_of(kTp)) return;  // the common case, every step: no tensor parallelism
  bool any = unit::is_unit_of(module, kTp);
  for (const auto& child : module.modules(/*include_self=*/false))
    any |= unit::is_unit_of(*child, kTp);
  if (!any) return;
  std::string split = "<root>";  // named only when refused: names cost strings every step
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (unit::is_unit_of(*item.value(), kTp)) {
      split = item.key();
      break;
    }
  }
  TORCH_CHECK(false, "ddp: clip_grad_norm: submodule '", split,
              "' is split by tensor parallelism; pass its TensorParallel: "
              "ddp::clip_grad_norm(model, *tp, max_norm) (without it each tp rank norms only "
              "its own shards)");
}

}  // namespace

optim::GradShards grad_shards(torch::nn::Module& module, const comm::Sharding& sharding,
                              bool nests_tensor_parallel) {
  if (!nests_tensor_parallel) refuse_split_without_tp(module);
  return optim::grad_shards(module, sharding);
}

optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 const optim::ClipOptions& options, int64_t step) {
  return optim::clip_grad_norm(grad_shards(module, tp.sharding(), true), options, step);
}

optim::ClipResult clip_grad_norm(torch::nn::Module& module, const tp::TensorParallel& tp,
                                 double max_norm) {
  optim::ClipOptions options;
  options.max_norm = max_norm;
  return clip_grad_norm(module, tp, options);
}

}  // namespace ddp::parallel
