#include "common/recipe_flags.hpp"

#include "common/flag_parse.hpp"
#include "ddp/optim/adam.hpp"
#include "ddp/optim/device_step.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/optim/sgd.hpp"

namespace ddp::tools {

void add_recipe_flags(CLI::App& app, RecipeFlags& flags,
                      const std::vector<std::string>& optimizers) {
  const FlagGroup group(app, "Recipe");
  std::string names;
  for (const auto& name : optimizers) names += (names.empty() ? "" : ", ") + name;
  app.add_option("--optimizer", flags.optimizer, names)
      ->check(CLI::IsMember(optimizers))
      ->capture_default_str();
  app.add_option("--weight-decay", flags.weight_decay,
                 "adamw: decoupled weight decay on the parameters with 2 or more dims")
      ->capture_default_str();
  app.add_option("--beta2", flags.beta2, "adam, adamw: the second-moment decay")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--warmup-steps", flags.warmup_steps,
                 "linear warmup of the learning rate over the first N steps")
      ->capture_default_str();
  app.add_option("--lr-decay-steps", flags.lr_decay_steps,
                 "the step at which the decay reaches --min-lr (0: no decay)")
      ->capture_default_str();
  app.add_option("--min-lr", flags.min_lr, "the rate the decay ends at (default: --lr / 10)");
  app.add_option("--lr-decay", flags.lr_decay,
                 "constant, linear or cosine (default: cosine with --lr-decay-steps)")
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  app.add_option("--grad-clip", flags.grad_clip,
                 "clip the total gradient norm (over every rank's shards) to C (default: off)");
  app.add_flag("--grad-skip-nonfinite", flags.skip_nonfinite,
               "with --grad-clip: skip (and count) a step whose gradient norm is nan or inf "
               "instead of stopping");
  app.add_option("--grad-accum", flags.grad_accum,
                 "micro-batches of --batch-size per rank per step (no_sync for all but the last)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

optim::LrScheduleOptions schedule_of(const RecipeFlags& flags, double lr) {
  optim::LrScheduleOptions s;
  s.lr = lr;
  s.min_lr = flags.min_lr >= 0 ? flags.min_lr : lr / 10;
  s.warmup_steps = flags.warmup_steps;
  s.decay_steps = flags.lr_decay_steps;
  s.decay = !flags.lr_decay.empty()    ? optim::decay_from_name(flags.lr_decay)
            : flags.lr_decay_steps > 0 ? optim::LrDecay::kCosine
                                       : optim::LrDecay::kConstant;
  return s;
}

bool has_schedule(const RecipeFlags& flags) {
  return flags.warmup_steps > 0 || schedule_of(flags, 1.0).decay != optim::LrDecay::kConstant;
}

optim::ClipOptions clip_of(const RecipeFlags& flags) {
  optim::ClipOptions clip;
  clip.max_norm = flags.grad_clip;
  clip.non_finite = flags.skip_nonfinite ? optim::NonFinite::kSkip : optim::NonFinite::kError;
  return clip;
}

std::string check_recipe_flags(const CLI::App& app, const RecipeFlags& flags, double lr,
                               bool optimizer_overlap) {
  if (app.count("--grad-clip") > 0) {
    if (std::string wrong = optim::clip_error(clip_of(flags)); !wrong.empty()) return wrong;
  }
  if (flags.skip_nonfinite && app.count("--grad-clip") == 0) {
    return "--grad-skip-nonfinite needs --grad-clip (the clip computes the gradient norm)";
  }
  if (app.count("--weight-decay") > 0 && flags.optimizer != "adamw") {
    return "--weight-decay needs --optimizer adamw, got --optimizer " + flags.optimizer;
  }
  if (flags.weight_decay < 0) {
    return "--weight-decay must be >= 0, got " + std::to_string(flags.weight_decay);
  }
  if (flags.grad_clip > 0 && optimizer_overlap) {
    return "--grad-clip cannot be combined with --optimizer-overlap: the optimizer steps inside "
           "backward, before the norm of the whole gradient is known";
  }
  if (flags.grad_accum > 1 && optimizer_overlap) {
    return "--grad-accum cannot be combined with --optimizer-overlap: the optimizer would step "
           "after every micro-batch";
  }
  return optim::schedule_error(schedule_of(flags, lr), schedule_flag_names());
}

optim::LrScheduleNames schedule_flag_names() {
  return {"--lr", "--min-lr", "--warmup-steps", "--lr-decay-steps"};
}

std::optional<optim::GradClipper> make_clipper(const RecipeFlags& flags, c10::Device device,
                                               int64_t first_step,
                                               torch::optim::Optimizer* optimizer) {
  std::optional<optim::GradClipper> clipper;
  if (flags.grad_clip <= 0) return clipper;
  clipper.emplace(clip_of(flags), device, first_step);
  if (auto* on_device = dynamic_cast<optim::DeviceStep*>(optimizer)) {
    on_device->skip_when(clipper->skip_flag());
  }
  return clipper;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const RecipeFlags& flags,
                                                        const std::vector<at::Tensor>& params,
                                                        double lr, double sgd_momentum) {
  if (flags.optimizer == "adamw") {
    const auto options =
        torch::optim::AdamWOptions(lr).betas({0.9, flags.beta2}).weight_decay(flags.weight_decay);
    return std::make_unique<optim::AdamW>(optim::weight_decay_groups(params, options), options);
  }
  if (flags.optimizer == "adam") {
    return std::make_unique<optim::Adam>(params,
                                         torch::optim::AdamOptions(lr).betas({0.9, flags.beta2}));
  }
  return std::make_unique<optim::Sgd>(params, torch::optim::SGDOptions(lr).momentum(sgd_momentum));
}

}  // namespace ddp::tools
