#pragma once
// GradientStats: the runtime stats of the gradient path (PyTorch's DDP logger), the same for every
// style (gradients/gradient_runtime.hpp): a TimelineRecorder listening on the path's events, the
// forward's duration, and the iterations sampled from them (obs/runtime_stats.hpp).

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/obs/runtime_stats.hpp"

namespace ddp::gradients {
class GradientListener;
class TimelineRecorder;  // internal (gradients/timeline_recorder.hpp)
}  // namespace ddp::gradients

namespace ddp::obs {

class GradientStats {
 public:
  // Samples iterations 1-10, then every `every`-th (>= 1).
  explicit GradientStats(int64_t every);
  ~GradientStats();
  GradientStats(const GradientStats&) = delete;
  GradientStats& operator=(const GradientStats&) = delete;

  // Add it to the gradient path (GradientRuntime::add_listener).
  gradients::GradientListener* listener();
  IterationTimeline last_timeline() const;

  // Around the wrapped module's forward (a synchronized one: ended only when a backward follows).
  void forward_started();
  void forward_ended();
  // Takes a sample of the last backward when `synchronized_backwards` moved on since the last
  // call; cheap otherwise. Call before each forward and before reading the samples.
  void collect(int64_t synchronized_backwards);
  // The samples and their averages into `data` (the caller fills the configuration).
  void fill(LoggingData& data) const;

 private:
  int64_t every_;
  std::unique_ptr<gradients::TimelineRecorder> timeline_;  // never null
  int64_t forward_start_ns_ = 0;
  int64_t last_forward_ns_ = 0;
  int64_t collected_through_ = 0;  // synchronized backwards already looked at
  std::vector<IterationStats> samples_;
};

}  // namespace ddp::obs
