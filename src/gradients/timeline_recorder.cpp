#include "ddp/gradients/timeline_recorder.hpp"

#include <algorithm>
#include <chrono>

#include "ddp/obs/timeline.hpp"

namespace ddp::gradients {

int64_t TimelineRecorder::since_start() const {
  return obs::steady_ns() - current_.backward_start_ns;
}

void TimelineRecorder::backward_started(const BackwardStarted& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = obs::IterationTimeline{};
  current_.iteration = event.iteration;
  current_.backward_start_ns = event.forward_end_ns;
  current_.param_ready_ns.assign(event.num_params, -1);
  current_.bucket_launch_ns.assign(event.num_buckets, -1);
  current_.bucket_comm_done_ns.assign(event.num_buckets, -1);
  current_.bucket_done_ns.assign(event.num_buckets, -1);
}

void TimelineRecorder::grad_ready(size_t param, bool used) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (param < current_.param_ready_ns.size()) {
    current_.param_ready_ns[param] = used ? since_start() : -1;
  }
}

void TimelineRecorder::bucket_launched(size_t bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bucket < current_.bucket_launch_ns.size()) current_.bucket_launch_ns[bucket] = since_start();
}

void TimelineRecorder::bucket_finished(const BucketFinished& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (event.bucket >= current_.bucket_done_ns.size()) return;
  current_.bucket_done_ns[event.bucket] = since_start();
  if (event.comm_done_ns >= 0) {
    // The launch is stamped when this listener hears of it, just after the collective was issued;
    // a small collective can complete before that. It then counts as done at its launch stamp, so
    // no interval runs backwards (stats would drop it).
    current_.bucket_comm_done_ns[event.bucket] = std::max(
        event.comm_done_ns - current_.backward_start_ns, current_.bucket_launch_ns[event.bucket]);
  }
}

void TimelineRecorder::backward_finished(int64_t /*iteration*/) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_.finalize_ns = since_start();
  last_ = current_;
}

obs::IterationTimeline TimelineRecorder::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

}  // namespace ddp::gradients
