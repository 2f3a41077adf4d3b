#pragma once
// Learning-rate schedules: the rate of a step as a pure function of the step, so that a resumed
// run continues the schedule from its step count alone and a captured step (graphs/) follows it
// by one device write per step (CapturableOptimizer::set_lr). libtorch 1.13 has StepLR only.
//
//   lr                 ___________
//            warmup  /            \___            cosine: min_lr + (lr - min_lr) * (1 + cos(pi r))
//            / 2
//                   /                 \____       linear: min_lr + (lr - min_lr) * (1 - r)
//   min_lr  _______/                       \_____ constant: lr
//           0    warmup_steps        decay_steps   (r = (step - warmup) / (decay - warmup))
//
// The warmup and cosine are nanoGPT's train.py get_lr(it): lr * (it + 1) / (warmup + 1) while
// it < warmup, then the decay, then min_lr past decay_steps.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp::optim {

enum class LrDecay { kConstant, kLinear, kCosine };

struct LrScheduleOptions {
  // The peak rate, reached at the end of the warmup; default 6e-4, nanoGPT's GPT-2 value.
  double lr = 6e-4;
  // The floor the decay ends at; default 6e-5 (lr / 10, as nanoGPT and Chinchilla suggest).
  double min_lr = 6e-5;
  // Steps of linear warmup from lr / (warmup_steps + 1); default 0 (none).
  int64_t warmup_steps = 0;
  // The step at which the decay reaches min_lr (kLinear, kCosine); default 0: set it for a decay.
  // Must be >= warmup_steps.
  int64_t decay_steps = 0;
  // The shape after the warmup; default kCosine, the GPT recipe's.
  LrDecay decay = LrDecay::kCosine;
};

// What schedule_error calls the fields: the struct's own names in a program (default); a tool
// passes its flags' (--lr, --min-lr, --warmup-steps, --lr-decay-steps).
struct LrScheduleNames {
  std::string lr = "LrScheduleOptions::lr";
  std::string min_lr = "LrScheduleOptions::min_lr";
  std::string warmup_steps = "LrScheduleOptions::warmup_steps";
  std::string decay_steps = "LrScheduleOptions::decay_steps";
};

// Why `options` is not a schedule ("" when it is): negative rates or steps, min_lr above lr, a
// decay that ends before its warmup, a decay without decay_steps; the fields called `names`.
std::string schedule_error(const LrScheduleOptions& options, const LrScheduleNames& names = {});

// The rate of step `step` (0-based: the step about to be taken). Throws schedule_error's text.
double lr_at(const LrScheduleOptions& options, int64_t step);

// "constant", "linear", "cosine"; and the reverse, throwing on another name with the valid ones.
const char* decay_name(LrDecay decay);
LrDecay decay_from_name(const std::string& name);

// The options as (name, value) rows, for --verbose and docs/options.md.
std::vector<std::pair<std::string, std::string>> describe(const LrScheduleOptions& options);

}  // namespace ddp::optim
