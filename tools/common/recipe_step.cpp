#include "common/recipe_step.hpp"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <optional>

#include "ddp/parallel/autocast.hpp"

namespace ddp::tools {

at::Tensor run_recipe_step(const RecipeStep& step, const std::vector<MicroBatch>& micro) {
  const int n = static_cast<int>(micro.size());
  TORCH_CHECK(n >= 1, "ddp: a training step needs at least one micro-batch");
  at::Tensor total;
  const auto forward_backward = [&](int k) {
    at::Tensor l;
    {
      std::optional<parallel::AutocastGuard> autocast;
      if (step.autocast_bf16) autocast.emplace(step.device.type(), at::kBFloat16);
      l = step.loss(step.forward(micro[k].x), micro[k].y);
    }
    if (k + 1 == n && step.on_phase) step.on_phase(RecipePhase::kForwardEnd, l);
    if (n == 1) {  // the step's loss as it is, as before accumulation existed
      l.backward();
      total = l.detach();
      return;
    }
    // Each micro loss is a mean over 1/n of the batch: the accumulated gradient is the whole
    // batch's mean, as without accumulation.
    (l / n).backward();
    total = k == 0 ? l.detach() / n : total + l.detach() / n;
  };
  for (int k = 0; k < n; ++k) {
    if (step.wrapped != nullptr && k + 1 < n) {
      auto quiet = step.wrapped->no_sync();  // gradients accumulate locally: one reduction a step
      forward_backward(k);
    } else {
      forward_backward(k);
    }
  }
  if (step.clipper != nullptr) step.clipper->clip(step.grad_shards());
  if (step.on_phase) step.on_phase(RecipePhase::kBackwardEnd, total);
  if (step.optimizer != nullptr) step.optimizer->step();
  return total;
}

}  // namespace ddp::tools
