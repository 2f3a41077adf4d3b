#pragma once
// What the gradient path tells the components that ride on it (the optimizer in backward, the
// stats timeline, join, traces): events of one synchronized backward, in this order on the
// autograd thread, under the reducer's lock:
//
//   backward_started
//     grad_ready(p) ... bucket_launched(b) ... grad_ready ... bucket_finished(b) ...
//   backward_finished                      (after every bucket_finished, before backward returns)
//
// A listener must not call back into the GradientRuntime. bucket_finished comes after the
// bucket's averaged gradients were written back to param.grad; buckets finish in plan order.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp::gradients {

struct BackwardStarted {
  int64_t iteration = 0;       // 1-based synchronized backward about to run
  int64_t forward_end_ns = 0;  // steady clock, when the forward that led here ended
  size_t num_params = 0;
  size_t num_buckets = 0;
};

struct BucketFinished {
  size_t bucket = 0;
  const std::vector<size_t>* params = nullptr;  // the bucket's parameter indices
  // Steady clock ns when its communication itself ended, or -1 when unknown (a CUDA future
  // completes when its work is enqueued; a device profiler gives the real span).
  int64_t comm_done_ns = -1;
};

class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void backward_started(const BackwardStarted& /*event*/) {}
  // `used`: false for a parameter counted ready with no gradient this iteration (unused).
  virtual void grad_ready(size_t /*param*/, bool /*used*/) {}
  virtual void bucket_launched(size_t /*bucket*/) {}
  virtual void bucket_finished(const BucketFinished& /*event*/) {}
  virtual void backward_finished(int64_t /*iteration*/) {}
  // True: finish buckets whose reduction already completed at every gradient-ready point, not
  // only at the end of backward (the optimizer in backward overlaps its steps that way).
  virtual bool wants_early_finish() const { return false; }
};

}  // namespace ddp::gradients
