#pragma once
// Where the gradient path (gradients/gradient_runtime.hpp) is in one iteration; checked at every
// transition and named in errors.

namespace ddp::gradients {

enum class IterationState {
  kIdle,           // no forward since the last backward: a backward now is an error
  kPreparedSync,   // forward done, its backward will be synchronized
  kPreparedLocal,  // forward done under no_sync: backward accumulates locally
  kBackwardSync,   // first gradient seen; finalize callback queued
  kBackwardLocal,  // first gradient seen under no_sync; reset callback queued
};

inline const char* iteration_state_name(IterationState s) {
  switch (s) {
    case IterationState::kIdle:
      return "idle";
    case IterationState::kPreparedSync:
      return "prepared (synchronized)";
    case IterationState::kPreparedLocal:
      return "prepared (no_sync)";
    case IterationState::kBackwardSync:
      return "in backward (synchronized)";
    case IterationState::kBackwardLocal:
      return "in backward (no_sync)";
  }
  return "?";
}

}  // namespace ddp::gradients
