#pragma once
// Runtime stats, as PyTorch's DDP logger samples them: iterations 1-10, then every N-th. Pure
// functions of the reducer's timelines and the forward times, so they are unit-testable.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::obs {

struct IterationStats {
  int64_t iteration = 0;            // 1-based synchronized iteration
  int64_t forward_compute_ns = 0;   // forward of the wrapped module
  int64_t backward_compute_ns = 0;  // end of forward to the last gradient ready
  int64_t backward_comm_ns = 0;     // first bucket launch to the last bucket's communication end
  // Communication that ran while backward compute was still going: the part of the buckets'
  // [launch, communication end] intervals, merged, before the last gradient was ready.
  int64_t backward_overlap_ns = 0;
  std::vector<int64_t> param_ready_ns;  // per parameter, from the end of forward; -1 unused
};

// Sampled: iterations 1..10, then every `every`-th.
bool should_sample(int64_t iteration, int64_t every);

IterationStats stats_from_timeline(const obs::IterationTimeline& timeline,
                                   int64_t forward_compute_ns);

struct LoggingData {
  int rank = 0;
  int world_size = 1;
  std::string backend;
  std::string comm_hook;
  std::map<std::string, std::string> options;         // every DDP option, as text
  std::vector<size_t> bucket_sizes;                   // bytes, in bucket order
  std::vector<buckets::Reduction> bucket_reductions;  // how each bucket is reduced, same order
  std::vector<std::string> param_names;               // index -> name for param_ready_ns
  int64_t iterations = 0;                             // synchronized iterations so far
  std::vector<IterationStats> samples;                // sampled iterations, oldest first
  // Means over the samples (0 when none).
  double avg_forward_compute_ns = 0, avg_backward_compute_ns = 0, avg_backward_comm_ns = 0,
         avg_backward_overlap_ns = 0;
};

void summarize(LoggingData& data);  // fills the averages from the samples
std::string format_summary(const LoggingData& data);

}  // namespace ddp::obs
