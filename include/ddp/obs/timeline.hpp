#pragma once
// What happened in one synchronized backward, in steady-clock nanoseconds relative to the end of
// its forward (backward_start_ns, absolute). A plain type on the ground floor: the recorder fills
// it from the reducer's events (gradients/timeline_recorder.hpp), stats and traces read it.

#include <chrono>
#include <cstdint>
#include <vector>

namespace ddp::obs {

// The clock of every timeline and trace stamp: steady-clock nanoseconds since its epoch.
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct IterationTimeline {
  int64_t iteration = 0;                  // 1-based synchronized-backward count
  int64_t backward_start_ns = 0;          // absolute: end of the forward that led to this backward
  std::vector<int64_t> param_ready_ns;    // per parameter; -1 if it was marked unused
  std::vector<int64_t> bucket_launch_ns;  // per bucket: when its reduction was started
  std::vector<int64_t> bucket_comm_done_ns;  // per bucket: when its communication completed
  std::vector<int64_t> bucket_done_ns;  // per bucket: when it was seen complete and written back
  int64_t finalize_ns = 0;              // when the end-of-backward callback finished
};

}  // namespace ddp::obs
