#include "common/captured_recipe.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "common/training_run.hpp"
#include "ddp/optim/device_step.hpp"

namespace ddp::tools {

CapturedRecipe::CapturedRecipe(TrainingRun& run, std::vector<MicroBatch> inputs, Inputs kind) {
  TORCH_CHECK(!inputs.empty(), "ddp: a captured step needs at least one micro-batch");
  torch::optim::Optimizer* const optimizer = run.optimizer();
  TORCH_CHECK(optimizer != nullptr,
              "ddp: a captured step needs the optimizer after backward, not in backward");
  loss_ = at::zeros({}, inputs.front().x.options().dtype(at::kFloat));
  // A replay is bounded like an eager collective, and under NCCL a stopped or dead rank ends this
  // one naming it, wherever the host waits (the loss read too).
  graphs::CapturedStepOptions options;
  options.replay_timeout = run.timeout();
  options.group = run.world();
  const RecipeStep recipe = run.recipe();
  auto body = [recipe, inputs, optimizer, loss = loss_]() mutable {
    // Dropped: the backward makes them in the graph's pool; DDP copies them into its buckets and
    // a sharded unit's reduced shard becomes them, instead of a zero and an add per parameter
    // (154 more kernels in the gpt-char FULLY_SHARD graph).
    optim::zero_grad(*optimizer, /*set_to_none=*/true);
    loss.copy_(run_recipe_step(recipe, inputs));
  };
  if (kind == Inputs::kFixed) {
    step_ = std::make_unique<graphs::CapturedStep>(std::move(body), run.device(), options);
    return;
  }
  std::vector<at::Tensor> statics;
  for (const MicroBatch& micro : inputs) {
    statics.push_back(micro.x);
    statics.push_back(micro.y);
  }
  step_ = std::make_unique<graphs::CapturedStep>(std::move(body), std::move(statics), run.device(),
                                                 options);
}

}  // namespace ddp::tools
