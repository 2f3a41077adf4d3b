// StepRng (graphs/step_rng.hpp): a step's random draws are a function of (seed, step). On the
// CPU (CI): step k draws the same whatever ran before it, neighbouring steps and seeds draw
// differently, and a negative step or another device is refused by exact text. On one GPU
// (scripts/gpu-check.sh, stage tests; skipped without CUDA): a captured dropout step and the same
// step run eagerly draw the same mask at every step, before and after a recapture (what a resumed
// captured run does), and a step that draws past its share of offsets is refused.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/detail/torch_compat.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/graphs/step_rng.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

torch::Tensor draw(const torch::Device& device) {
  return torch::dropout(torch::ones({4096}, device), 0.5, /*train=*/true);
}

TEST(StepRng, AStepDrawsTheSameWhateverRanBefore) {
  graphs::StepRng rng(torch::kCPU, 1234);
  rng.begin_step(7);
  const auto fresh = draw(torch::kCPU);
  graphs::StepRng other(torch::kCPU, 1234);
  for (int step = 0; step < 7; ++step) {
    other.begin_step(step);
    (void)draw(torch::kCPU);
    (void)torch::randn({17});  // more draws than a step's: they must not matter
  }
  other.begin_step(7);
  EXPECT_TRUE(torch::equal(draw(torch::kCPU), fresh));
  other.begin_step(8);
  EXPECT_FALSE(torch::equal(draw(torch::kCPU), fresh)) << "step 8 draws step 7's mask";
  graphs::StepRng reseeded(torch::kCPU, 1235);
  reseeded.begin_step(7);
  EXPECT_FALSE(torch::equal(draw(torch::kCPU), fresh)) << "seed 1235 draws seed 1234's mask";
}

TEST(StepRng, Refusals) {
  graphs::StepRng rng(torch::kCPU, 1);
  EXPECT_EQ(error_of([&] { rng.begin_step(-1); }), "StepRng: step -1 is negative");
  EXPECT_EQ(error_of([&] { graphs::StepRng meta(torch::Device("meta"), 1); }),
            "StepRng: device meta is neither the CPU nor CUDA");
}

// Ten steps of dropout, captured (warm-up 2, so steps 2.. replay) and eager, each step begun by
// StepRng: the same masks. Then a second CapturedStep from step 5 on (a resumed run captures
// again): the same masks again.
DDP_TEST_WORKER(step_rng_captured_equals_eager) {
  const torch::Device cuda("cuda:0");
  const auto ones = torch::ones({1 << 16}, cuda);
  auto out = torch::zeros({1 << 16}, cuda);
  const auto body = [&] {
    out.copy_(torch::dropout(ones, 0.5, true) * torch::dropout(ones, 0.1, true));
  };
  const auto masks = [&](int first, bool captured) {
    graphs::StepRng rng(cuda, 42);
    graphs::CapturedStepOptions options;
    options.warmup_steps = 2;
    std::unique_ptr<graphs::CapturedStep> step;
    if (captured) step = std::make_unique<graphs::CapturedStep>(body, cuda, options);
    std::vector<torch::Tensor> seen;
    for (int s = first; s < 10; ++s) {
      rng.begin_step(s);
      (void)torch::rand({3}, cuda);  // a draw outside the step (a validation pass) moves nothing
      rng.begin_step(s);
      if (step) {
        step->run();
      } else {
        body();
      }
      seen.push_back(out.cpu().clone());
    }
    if (step) require(step->state() == graphs::CapturedStep::State::kReplaying, "not captured");
    return seen;
  };
  const auto eager = masks(0, false);
  const auto captured = masks(0, true);
  const auto resumed = masks(5, true);
  for (size_t s = 0; s < eager.size(); ++s) {
    require(torch::equal(captured[s], eager[s]),
            "step " + std::to_string(s) + ": captured differs");
    if (s > 0) require(!torch::equal(eager[s], eager[s - 1]), "steps draw alike");
  }
  for (size_t s = 5; s < eager.size(); ++s) {
    require(torch::equal(resumed[s - 5], eager[s]),
            "step " + std::to_string(s) + ": the recaptured run differs");
  }
#if DDP_HAVE_CUDA_GRAPHS  // Generator::set_offset: torch >= 2.1, the CUDA builds'
  // A step drawing past its offsets: set the generator beyond them by hand, then begin the next.
  graphs::StepRng rng(cuda, 42);
  rng.begin_step(3);
  at::Generator gen = at::globalContext().defaultGenerator(cuda);
  gen.set_offset(4 * graphs::StepRng::kOffsetsPerStep + 4);
  const std::string err = error_of([&] { rng.begin_step(4); });
  require(err ==
              "StepRng: step 3 drew 4294967300 random offsets on cuda:0, more than the "
              "4294967296 a step may before step 4's begin",
          "the overdraw refusal, got: '" + err + "'");
#endif
}

TEST(StepRngGpu, CapturedEqualsEagerAndRecaptured) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_WORKERS_PASS(run_workers(step_rng_captured_equals_eager, 1));
}

}  // namespace
}  // namespace ddp::testing
