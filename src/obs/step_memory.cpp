#include "ddp/obs/step_memory.hpp"

#include <algorithm>

#include "ddp/obs/device_memory.hpp"

namespace ddp::obs {

int64_t StepMemory::peak() const { return std::max({forward_peak, backward_peak, optimizer_peak}); }

void StepMemoryMeter::start(StepPhase) { reset_device_peak(device_); }

void StepMemoryMeter::stop(StepPhase phase) {
  const int64_t peak = device_peak_allocated_bytes(device_);
  int64_t& slot = phase == StepPhase::kForward    ? memory_.forward_peak
                  : phase == StepPhase::kBackward ? memory_.backward_peak
                                                  : memory_.optimizer_peak;
  slot = std::max(slot, peak);
}

void StepMemoryMeter::step_end() {
  memory_.between_steps = std::max(memory_.between_steps, device_allocated_bytes(device_));
}

}  // namespace ddp::obs
