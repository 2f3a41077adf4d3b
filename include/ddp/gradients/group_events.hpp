#pragma once
// GroupEvents: the gradient path's listeners (gradient_events.hpp) as one bucket group of the
// GradientRuntime reaches them. A group numbers its parameters and buckets from 0; the runtime
// numbers every group's in one sequence (the units' first, then the replicated parameters'), so
// that a listener (stats, trace, the optimizer in backward) sees one model: this adds the group's
// first indices to what it reports.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/gradients/gradient_events.hpp"

namespace ddp::gradients {

class GroupEvents {
 public:
  // `listeners` is the runtime's list; it outlives this object.
  explicit GroupEvents(const std::vector<GradientListener*>& listeners) : listeners_(listeners) {}

  // Where the group's parameter 0 and bucket 0 are in the runtime's numbering. Fixed once the
  // groups are made: a group's bucket count changes only for the last group (the replicated one).
  void set_first(size_t param, size_t bucket) {
    first_param_ = param;
    first_bucket_ = bucket;
  }
  size_t first_bucket() const { return first_bucket_; }

  void grad_ready(size_t param, bool used) const {
    for (auto* l : listeners_) l->grad_ready(first_param_ + param, used);
  }
  // The group's buckets [end - count, end) were launched.
  void launched(size_t end, size_t count) const {
    for (size_t b = end - count; b < end; ++b) {
      for (auto* l : listeners_) l->bucket_launched(first_bucket_ + b);
    }
  }
  // The group's bucket `bucket`, holding its parameters `params`, finished and was written back.
  void finished(size_t bucket, const std::vector<size_t>& params, int64_t comm_done_ns) {
    if (listeners_.empty()) return;
    const std::vector<size_t>* global = &params;
    if (first_param_ != 0) {
      global_.assign(params.begin(), params.end());
      for (auto& p : global_) p += first_param_;
      global = &global_;
    }
    const BucketFinished event{first_bucket_ + bucket, global, comm_done_ns};
    for (auto* l : listeners_) l->bucket_finished(event);
  }

 private:
  const std::vector<GradientListener*>& listeners_;
  size_t first_param_ = 0;
  size_t first_bucket_ = 0;
  std::vector<size_t> global_;  // finished()'s parameter indices in the runtime's numbering
};

}  // namespace ddp::gradients
