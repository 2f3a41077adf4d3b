#pragma once
// The GPT recipe's flags (nanoGPT's train.py), shared by ddp-train and ddp-bench and spelled as
// bench/reference/torch_ddp.py spells them, so that one command line serves both sides of a
// comparison: the optimizer and its weight-decay groups, the learning-rate schedule, gradient
// clipping and accumulation. Defaults leave a tool as it was (its SGD, a constant rate, no clip,
// one micro-batch a step).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/optim/grad_clip.hpp"
#include "ddp/optim/lr_schedule.hpp"

namespace torch::optim {
class Optimizer;
}

namespace ddp::tools {

struct RecipeFlags {
  // --optimizer sgd|adam|adamw. adamw: two groups (optim/param_groups.hpp), decay on dim >= 2.
  std::string optimizer = "sgd";
  double weight_decay = 0.1;  // --weight-decay: adamw's decoupled decay (nanoGPT's 0.1)
  double beta2 = 0.999;       // --beta2: Adam(W)'s second-moment decay; PyTorch's default
  // --warmup-steps, --lr-decay-steps, --min-lr (-1: --lr / 10), --lr-decay ("": cosine when
  // --lr-decay-steps is given, else constant): optim/lr_schedule.hpp, the peak being --lr.
  int64_t warmup_steps = 0;
  int64_t lr_decay_steps = 0;
  double min_lr = -1;
  std::string lr_decay;
  // --grad-clip C: clip the total gradient norm to C (optim/grad_clip.hpp); 0 (not given): off.
  double grad_clip = 0;
  // --grad-skip-nonfinite: a step whose gradient norm is nan or inf is skipped and counted
  // instead of ending the run (needs --grad-clip, which computes the norm).
  bool skip_nonfinite = false;
  // --grad-accum N: N micro-batches of --batch-size per rank per step, the first N - 1 under
  // no_sync, each loss divided by N: one step on N times the batch.
  int grad_accum = 1;
};

// Registers the flags above; `optimizers` the names --optimizer accepts.
void add_recipe_flags(CLI::App& app, RecipeFlags& flags,
                      const std::vector<std::string>& optimizers);

// After parsing: the complaint about the recipe flags ("" when all is well), with `lr` the
// run's peak rate: --grad-clip <= 0 given, --weight-decay without adamw, a schedule that is not
// one (optim::schedule_error's texts), --grad-skip-nonfinite without --grad-clip, and clipping or
// accumulation with `optimizer_overlap` (--optimizer-overlap steps inside backward).
std::string check_recipe_flags(const CLI::App& app, const RecipeFlags& flags, double lr,
                               bool optimizer_overlap);

optim::LrScheduleOptions schedule_of(const RecipeFlags& flags, double lr);
// The flags that set LrScheduleOptions' fields, for optim::schedule_error's texts.
optim::LrScheduleNames schedule_flag_names();
optim::ClipOptions clip_of(const RecipeFlags& flags);
// Whether the rate changes over the run (a warmup or a decay): then set every step.
bool has_schedule(const RecipeFlags& flags);

// --grad-clip's clipper (none without it) on `device`, its first step numbered `first_step`, and
// `optimizer` (one of the house's, or null) told to drop a step whose norm is not finite, on the
// device.
std::optional<optim::GradClipper> make_clipper(const RecipeFlags& flags, c10::Device device,
                                               int64_t first_step,
                                               torch::optim::Optimizer* optimizer);

// flags.optimizer over `params` (distinct) at rate `lr`: SGD with `sgd_momentum`, Adam with
// betas (0.9, beta2), AdamW the same in weight-decay groups (dim >= 2 decayed, the rest not). The
// house's optimizers (optim/sgd.hpp, optim/adam.hpp): one implementation for eager and captured
// steps, fused kernels on CUDA, torch::optim's arithmetic on the CPU.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const RecipeFlags& flags,
                                                        const std::vector<at::Tensor>& params,
                                                        double lr, double sgd_momentum);

}  // namespace ddp::tools
