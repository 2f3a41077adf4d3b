#pragma once
// StepRng: the random numbers a training step draws (dropout) as a function of (seed, step), not
// of the steps before it, so that
//   - a captured step and the same step run eagerly draw the same masks (a replay reads the
//     generator's offset at launch; an eager step reads it kernel by kernel from the same base),
//   - a run resumed from a checkpoint at step k draws at step k what the uninterrupted run drew,
//     although its warm-up, capture and validation passes moved the generator differently.
// Call begin_step(step) before each step, outside any capture.
//
// CUDA: the device's default Philox generator gets `seed` and the offset step * kOffsetsPerStep
// (the generator's counter; every random kernel of the step advances it from there, and a replay
// advances it by the whole graph's count). The CPU's default generator (a Mersenne Twister, no
// offset) gets a seed mixed from (seed, step) instead. Every rank draws the same masks, as ranks
// seeded alike do in PyTorch.

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace ddp::graphs {

class StepRng {
 public:
  // Offsets one step may draw on CUDA: a step that draws more is refused at the next begin_step
  // (its draws would overlap the next step's). Philox counts in 64 bits; 2^32 per step leaves 2^31
  // steps, and a GPT step draws thousands.
  static constexpr uint64_t kOffsetsPerStep = uint64_t{1} << 32;

  StepRng(c10::Device device, uint64_t seed);

  // Sets the device's default generator for step `step` (>= 0). Refuses, naming both steps, a
  // previous step that drew more than kOffsetsPerStep offsets.
  void begin_step(int64_t step);

 private:
  c10::Device device_;
  uint64_t seed_;
  // CUDA: the step begun last and its base offset, for the overdraw check; empty before the first.
  std::optional<int64_t> last_step_;
};

}  // namespace ddp::graphs
