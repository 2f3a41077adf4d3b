#pragma once
// The recipe step (recipe_step.hpp) captured in one CUDA graph (graphs/captured_step.hpp), as both
// tools make it: the gradients dropped, then the whole step (micro-batches, autocast, clip, the
// optimizer), its loss written into a static tensor that every run fills.
//
//   CapturedRecipe captured(run, inputs, CapturedRecipe::Inputs::kRefilled);
//   captured.step().run(batch);     // a pinned host batch copied into the static inputs
//   read(captured.loss());          // after the run, on the device

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "common/recipe_step.hpp"
#include "ddp/graphs/captured_step.hpp"

namespace ddp::tools {

class TrainingRun;

class CapturedRecipe {
 public:
  // Whether run(batch) copies a new batch into the static inputs before each step (ddp-train's
  // steps read the next samples), or the inputs stay as given (ddp-bench's one batch).
  enum class Inputs { kFixed, kRefilled };

  // `inputs`: the micro-batches on the run's device the graph reads. The run's optimizer must
  // exist (the tools refuse --cuda-graph with --optimizer-overlap). Collective: capture and replay
  // are every rank's.
  CapturedRecipe(TrainingRun& run, std::vector<MicroBatch> inputs, Inputs kind);

  graphs::CapturedStep& step() { return *step_; }
  const graphs::CapturedStep& step() const { return *step_; }
  // The last run's loss (a float scalar on the device).
  const at::Tensor& loss() const { return loss_; }

 private:
  at::Tensor loss_;
  std::unique_ptr<graphs::CapturedStep> step_;
};

}  // namespace ddp::tools
