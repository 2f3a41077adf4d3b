#include "ddp/graphs/step_rng.hpp"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>

#include <mutex>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::graphs {
namespace {

// splitmix64's finalizer: neighbouring steps get unrelated Mersenne Twister seeds.
uint64_t mix(uint64_t seed, uint64_t step) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (step + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

StepRng::StepRng(c10::Device device, uint64_t seed) : device_(device), seed_(seed) {
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "StepRng: device ", device,
              " is neither the CPU nor CUDA");
}

void StepRng::begin_step(int64_t step) {
  TORCH_CHECK(step >= 0, "StepRng: step ", step, " is negative");
  at::Generator gen = at::globalContext().defaultGenerator(device_);
  std::lock_guard<std::mutex> lock(gen.mutex());
  if (device_.is_cpu()) {
    gen.set_current_seed(mix(seed_, uint64_t(step)));
    return;
  }
#if DDP_HAVE_CUDA_GRAPHS
  if (last_step_) {
    const uint64_t base = uint64_t(*last_step_) * kOffsetsPerStep;
    const uint64_t now = gen.get_offset();
    const uint64_t drawn = now >= base ? now - base : 0;  // below: reseeded since, nothing to say
    TORCH_CHECK(drawn <= kOffsetsPerStep, "StepRng: step ", *last_step_, " drew ", drawn,
                " random offsets on ", device_, ", more than the ", kOffsetsPerStep,
                " a step may before step ", step, "'s begin");
  }
  gen.set_current_seed(seed_);
  gen.set_offset(uint64_t(step) * kOffsetsPerStep);
  last_step_ = step;
#else
  TORCH_CHECK(false, "StepRng: this libddp was built without CUDA, device ", device_);
#endif
}

}  // namespace ddp::graphs
