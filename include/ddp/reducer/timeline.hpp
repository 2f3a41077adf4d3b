#pragma once
// What happened in the last synchronized backward, in steady-clock nanoseconds since its first
// gradient became ready. Kept by the Reducer for tests (overlap) and for obs/ stats.

#include <cstdint>
#include <vector>

namespace ddp::reducer {

struct IterationTimeline {
  int64_t backward_start_ns = 0;          // absolute steady-clock time of the first ready gradient
  std::vector<int64_t> param_ready_ns;    // per parameter; -1 if it was marked unused
  std::vector<int64_t> bucket_launch_ns;  // per bucket: when its all-reduce was started
  std::vector<int64_t> bucket_done_ns;    // per bucket: when finalize saw it complete
  int64_t finalize_ns = 0;                // when the end-of-backward callback finished
};

}  // namespace ddp::reducer
