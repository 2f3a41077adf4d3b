#pragma once
// TimelineRecorder: a listener on the reducer's own events (it lives with them in gradients/, below
// obs/stats and obs/trace, which read what it records) that keeps the last synchronized
// backward's IterationTimeline, for runtime stats (logging_data), Chrome traces and tests of
// overlap. The host timestamps are taken here, not on the reducer's path: without a recorder the
// gradient path reads no clock per gradient or bucket.

#include <cstdint>
#include <mutex>

#include "ddp/gradients/gradient_events.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::gradients {

class TimelineRecorder : public GradientListener {
 public:
  void backward_started(const BackwardStarted& event) override;
  void grad_ready(size_t param, bool used) override;
  void bucket_launched(size_t bucket) override;
  void bucket_finished(const BucketFinished& event) override;
  void backward_finished(int64_t iteration) override;

  // A copy of the last completed synchronized backward's timeline (empty before the first).
  obs::IterationTimeline last() const;

 private:
  int64_t since_start() const;
  mutable std::mutex mutex_;        // events come on the autograd thread, last() on the user's
  obs::IterationTimeline current_;  // being filled
  obs::IterationTimeline last_;     // the last completed one
};

}  // namespace ddp::gradients
