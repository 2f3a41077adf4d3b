// Learning-rate schedules (optim/lr_schedule.hpp) by closed form at chosen steps, against
// nanoGPT's get_lr(it) written out here; the bad options by exact text; the rows of
// docs/options.md.

#include "ddp/optim/lr_schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "support/error_text.hpp"

namespace ddp::testing {
namespace {

using optim::LrDecay;
using optim::LrScheduleOptions;

LrScheduleOptions gpt(LrDecay decay) {
  LrScheduleOptions o;
  o.lr = 6e-4;
  o.min_lr = 6e-5;
  o.warmup_steps = 10;
  o.decay_steps = 110;
  o.decay = decay;
  return o;
}

// nanoGPT train.py's get_lr, for the cosine rows.
double nanogpt(int64_t it) {
  const double lr = 6e-4, min_lr = 6e-5;
  const int64_t warmup = 10, decay = 110;
  if (it < warmup) return lr * (it + 1) / (warmup + 1);
  if (it > decay) return min_lr;
  const double ratio = static_cast<double>(it - warmup) / (decay - warmup);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

TEST(LrSchedule, CosineIsNanoGptsGetLr) {
  const auto o = gpt(LrDecay::kCosine);
  for (int64_t step : {0, 1, 5, 9, 10, 11, 35, 60, 85, 109, 110, 111, 500}) {
    EXPECT_DOUBLE_EQ(optim::lr_at(o, step), nanogpt(step)) << "step " << step;
  }
  // Closed forms: the first warmup step, the peak, the midpoint, the floor.
  EXPECT_DOUBLE_EQ(optim::lr_at(o, 0), 6e-4 / 11);
  EXPECT_DOUBLE_EQ(optim::lr_at(o, 10), 6e-4);
  EXPECT_NEAR(optim::lr_at(o, 60), (6e-4 + 6e-5) / 2, 1e-18);
  EXPECT_DOUBLE_EQ(optim::lr_at(o, 110), 6e-5);
}

TEST(LrSchedule, LinearAndConstant) {
  const auto linear = gpt(LrDecay::kLinear);
  EXPECT_DOUBLE_EQ(optim::lr_at(linear, 4), 6e-4 * 5 / 11);
  EXPECT_DOUBLE_EQ(optim::lr_at(linear, 10), 6e-4);
  EXPECT_NEAR(optim::lr_at(linear, 35), 6e-5 + 0.75 * (6e-4 - 6e-5), 1e-18);
  EXPECT_DOUBLE_EQ(optim::lr_at(linear, 1000), 6e-5);
  LrScheduleOptions constant;
  constant.lr = 0.1;
  constant.decay = LrDecay::kConstant;
  EXPECT_DOUBLE_EQ(optim::lr_at(constant, 0), 0.1);  // no warmup, no decay_steps needed
  EXPECT_DOUBLE_EQ(optim::lr_at(constant, 123456), 0.1);
  constant.warmup_steps = 3;
  EXPECT_DOUBLE_EQ(optim::lr_at(constant, 1), 0.1 * 2 / 4);
  // Decay ending where the warmup ends: a step down to min_lr after the peak.
  auto abrupt = gpt(LrDecay::kCosine);
  abrupt.decay_steps = 10;
  EXPECT_DOUBLE_EQ(optim::lr_at(abrupt, 10), 6e-5);
}

// A resume continues the schedule: the rate depends on the step alone, so the steps after a
// restart at step 40 see what an uninterrupted run sees.
TEST(LrSchedule, AResumeContinuesTheSchedule) {
  const auto o = gpt(LrDecay::kCosine);
  std::vector<double> uninterrupted, resumed;
  for (int64_t s = 0; s < 120; ++s) uninterrupted.push_back(optim::lr_at(o, s));
  for (int64_t s = 0; s < 40; ++s) resumed.push_back(optim::lr_at(o, s));
  const LrScheduleOptions reloaded = o;  // what a checkpoint would give back
  for (int64_t s = 40; s < 120; ++s) resumed.push_back(optim::lr_at(reloaded, s));
  EXPECT_EQ(resumed, uninterrupted);
}

TEST(LrSchedule, BadOptionsAreNamed) {
  // In a program: the struct's fields (issue 46: the library spoke of ddp-train's flags).
  auto o = gpt(LrDecay::kCosine);
  o.warmup_steps = 200;
  EXPECT_EQ(optim::schedule_error(o),
            "LrScheduleOptions::warmup_steps (200) must not exceed LrScheduleOptions::decay_steps "
            "(110): the decay would end before the warmup");
  EXPECT_EQ(error_of([&] { optim::lr_at(o, 0); }),
            "ddp: LrScheduleOptions::warmup_steps (200) must not exceed "
            "LrScheduleOptions::decay_steps (110): the decay would end before the warmup");
  // In a tool: the names it passes, its flags.
  const optim::LrScheduleNames flags{"--lr", "--min-lr", "--warmup-steps", "--lr-decay-steps"};
  EXPECT_EQ(optim::schedule_error(o, flags),
            "--warmup-steps (200) must not exceed --lr-decay-steps (110): the decay would end "
            "before the warmup");
  o = gpt(LrDecay::kLinear);
  o.decay_steps = 0;
  o.warmup_steps = 0;
  EXPECT_EQ(optim::schedule_error(o, flags),
            "a linear decay needs --lr-decay-steps (the step at which it reaches --min-lr)");
  o = gpt(LrDecay::kCosine);
  o.min_lr = 1e-3;
  EXPECT_EQ(optim::schedule_error(o, flags),
            "--min-lr must be between 0 and --lr (0.0006), got 0.001");
  EXPECT_EQ(optim::schedule_error(o),
            "LrScheduleOptions::min_lr must be between 0 and LrScheduleOptions::lr (0.0006), got "
            "0.001");
  o.min_lr = 0;
  o.lr = 0;
  EXPECT_EQ(optim::schedule_error(o, flags), "--lr must be a positive number, got 0");
  EXPECT_EQ(error_of([] { optim::decay_from_name("step"); }),
            "ddp: unknown learning-rate decay 'step'; valid: constant, linear, cosine");
  EXPECT_EQ(optim::decay_from_name("linear"), LrDecay::kLinear);
}

}  // namespace
}  // namespace ddp::testing
