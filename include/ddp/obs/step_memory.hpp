#pragma once
// StepMemory: where a training step's memory peaks, phase by phase, for any style: the peak of
// the bytes allocated during the forward, during the backward and during the optimizer step, and
// what stays allocated between steps. From the CUDA caching allocator's statistics on the GPU
// (host-side bookkeeping: no device synchronization), and on the CPU from the counted tensor
// storages (obs/cpu_memory.hpp). ddp-bench fills one over its timed steps (--verbose, --json).

#include <c10/core/Device.h>

#include <cstdint>

namespace ddp::obs {

enum class StepPhase { kForward, kBackward, kOptimizer };

// Bytes; -1: not measured (no counter for the device).
struct StepMemory {
  int64_t forward_peak = -1;    // the most allocated at once during a forward
  int64_t backward_peak = -1;   // ... during a backward
  int64_t optimizer_peak = -1;  // ... during an optimizer step
  int64_t between_steps = -1;   // allocated after a step (gradients, optimizer state, shards)
  // The step's peak: the largest of the three phases'.
  int64_t peak() const;
};

// Measures phases of the steps it is told about; each value is the largest over those steps.
class StepMemoryMeter {
 public:
  explicit StepMemoryMeter(const c10::Device& device) : device_(device) {}
  // A phase starts: the device's peak is reset to what is allocated now.
  void start(StepPhase phase);
  // The phase ended: its peak is read.
  void stop(StepPhase phase);
  // A step ended: what stays allocated is read.
  void step_end();
  const StepMemory& result() const { return memory_; }

 private:
  c10::Device device_;
  StepMemory memory_;
};

}  // namespace ddp::obs
