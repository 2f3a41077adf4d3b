#include "ddp/obs/gradient_stats.hpp"

#include <c10/util/Exception.h>

#include "ddp/gradients/timeline_recorder.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::obs {

GradientStats::GradientStats(int64_t every)
    : every_(every), timeline_(std::make_unique<gradients::TimelineRecorder>()) {
  TORCH_CHECK(every_ >= 1, "ddp: stats_every must be at least 1, got ", every_);
}

GradientStats::~GradientStats() = default;

gradients::GradientListener* GradientStats::listener() { return timeline_.get(); }

IterationTimeline GradientStats::last_timeline() const { return timeline_->last(); }

void GradientStats::forward_started() { forward_start_ns_ = obs::steady_ns(); }

void GradientStats::forward_ended() { last_forward_ns_ = obs::steady_ns() - forward_start_ns_; }

void GradientStats::collect(int64_t synchronized_backwards) {
  if (synchronized_backwards == collected_through_) return;
  collected_through_ = synchronized_backwards;
  if (!obs::should_sample(synchronized_backwards, every_)) return;
  samples_.push_back(obs::stats_from_timeline(timeline_->last(), last_forward_ns_));
  if (samples_.size() > 64) samples_.erase(samples_.begin());  // bounded memory in long runs
}

void GradientStats::fill(obs::LoggingData& data) const {
  data.samples = samples_;
  obs::summarize(data);
}

}  // namespace ddp::obs
