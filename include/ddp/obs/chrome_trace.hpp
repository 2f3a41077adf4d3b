#pragma once
// A Chrome trace (chrome://tracing, Perfetto, or tools/trace-svg): one track per rank, lane 0 for
// compute (forward, backward, optimizer), lane 1 for each bucket's communication from launch to
// completion. Each rank records its own spans; write_merged() gathers them through the store and
// rank 0 writes one file.

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::obs {

struct TraceSpan {
  std::string name;      // "forward", "backward", "optimizer", "bucket 3", ...
  std::string cat;       // "compute" or "comm"
  int lane = 0;          // 0 compute, 1 comm
  int64_t start_ns = 0;  // steady clock, absolute (shared by processes on one host)
  int64_t end_ns = 0;
  int64_t step = -1;   // training step, -1 if none
  int64_t bytes = -1;  // bucket size, -1 if none
};

class ChromeTrace {
 public:
  explicit ChromeTrace(int rank) : rank_(rank) {}
  void add(TraceSpan span) { spans_.push_back(std::move(span)); }
  // The communication spans of one synchronized backward, from the reducer's timeline.
  void add_buckets(const obs::IterationTimeline& timeline, const buckets::BucketPlan& plan,
                   int64_t step);
  const std::vector<TraceSpan>& spans() const { return spans_; }
  // This rank's events as a JSON array (ts/dur in microseconds from `origin_ns`).
  std::string events_json(int64_t origin_ns) const;
  // Collective: every rank passes its spans to rank 0 through the store; rank 0 writes `path`
  // with all ranks' events, times relative to the earliest span of any rank.
  void write_merged(comm::ProcessGroup& pg, const std::string& path) const;
  // Single process (no process group).
  void write(const std::string& path) const;

 private:
  int rank_;
  std::vector<TraceSpan> spans_;
};

// Steady-clock nanoseconds, the clock every span uses.
int64_t trace_now_ns();

}  // namespace ddp::obs
