#pragma once
// One training step of the GPT recipe, as ddp-train runs it eagerly and as both tools capture it
// (graphs/captured_step.hpp): N micro-batches, all but the last under no_sync, each loss divided
// by N and under bf16 autocast if asked; then the clip of the whole gradient norm and the
// optimizer step. Nothing in it reads the device on the host, so the same function is a captured
// step's body: the clip's norm and skip flag stay on the device (optim::GradClipper), the
// optimizer reads its rate and step count there (optim::DeviceStep) and drops a non-finite step
// itself.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <vector>

#include "ddp/optim/grad_clip.hpp"
#include "ddp/parallel/data_parallel.hpp"

namespace torch::optim {
class Optimizer;
}

namespace ddp::tools {

struct MicroBatch {
  at::Tensor x, y;
};

// Where a step is when RecipeStep::on_phase is told: ddp-bench's per-phase timestamps and memory.
enum class RecipePhase {
  kForwardEnd,   // the last micro-batch's loss is computed (the others' backward ran); its
                 // backward is next
  kBackwardEnd,  // the last backward and the clip ran; the optimizer step is next
};

struct RecipeStep {
  // The wrapped model, for no_sync between micro-batches; null: a bare model (one process).
  DataParallel<torch::nn::AnyModule>* wrapped = nullptr;
  std::function<at::Tensor(const at::Tensor&)> forward;                  // the model's output
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;  // a mean over the batch
  bool autocast_bf16 = false;  // forward and loss under bf16 autocast on `device`
  c10::Device device = c10::kCPU;
  // --grad-clip; null: none. grad_shards gives this rank's gradients as split (for the norm).
  optim::GradClipper* clipper = nullptr;
  std::function<optim::GradShards()> grad_shards;
  // Null: the optimizer steps inside backward (--optimizer-overlap).
  torch::optim::Optimizer* optimizer = nullptr;
  // Told at each phase's end with a loss: at kForwardEnd the last micro-batch's as computed
  // (before the division by N), at kBackwardEnd the step's. Null: nobody listens. It must not
  // read the device on a captured step.
  std::function<void(RecipePhase, const at::Tensor& loss)> on_phase;
};

// Runs the step over `micro` (the caller has zeroed the gradients) and returns its loss: the mean
// of the micro-batches' losses, detached, on the device.
at::Tensor run_recipe_step(const RecipeStep& step, const std::vector<MicroBatch>& micro);

}  // namespace ddp::tools
