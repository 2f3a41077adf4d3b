#include "ddp/gradients/unused_params.hpp"

#include <ATen/ATen.h>
#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::gradients {

UnusedParams::UnusedParams(size_t num_params, const at::TensorOptions& device_like, bool on_device)
    : on_device_(on_device), reachable_(num_params, true), globally_used_(num_params, true) {
  const auto n = static_cast<int64_t>(num_params);
  // Pinned, so the copy to the device at each synchronized backward is asynchronous.
  local_ = at::zeros({n}, at::TensorOptions(at::kInt).pinned_memory(on_device_));
  wire_ = on_device_ ? at::zeros({n}, device_like.dtype(at::kInt)) : local_;
}

std::vector<bool> UnusedParams::find_unused(bool map, bool recorded, comm::ProcessGroup& pg) {
  const size_t n = reachable_.size();
  std::vector<bool> unused(n, false);
  if (recorded) {
    // Recorded in iteration 1: no walk, no used-map collective.
    unused = static_unused_;
    globally_used_ = static_globally_used_;
    ready_ = true;
  } else if (map) {
    for (size_t p = 0; p < n; ++p) {
      unused[p] = !reachable_[p];
      if (reachable_[p]) local_.data_ptr<int>()[p] = 1;
    }
    if (on_device_) wire_.copy_(local_, /*non_blocking=*/true);
    const comm::ForPurpose purpose({comm::Purpose::kControl});
    work_ = pg.allreduce_sum_async(wire_);
    ready_ = false;
  } else {
    globally_used_.assign(n, true);
    ready_ = true;
  }
  return unused;
}

bool UnusedParams::map_ready() const { return ready_ || (work_ && work_->isCompleted()); }

void UnusedParams::wait(comm::ProcessGroup& pg) {
  if (ready_) return;
  pg.wait(work_, "all-reduce of the used-parameter map");
  const at::Tensor global = wire_.cpu();
  for (size_t p = 0; p < globally_used_.size(); ++p) {
    globally_used_[p] = global.data_ptr<int>()[p] > 0;
  }
  work_.reset();
  ready_ = true;
}

void UnusedParams::record_static() {
  static_unused_.assign(reachable_.size(), false);
  for (size_t p = 0; p < reachable_.size(); ++p) static_unused_[p] = !reachable_[p];
  static_globally_used_ = globally_used_;
}

void UnusedParams::reset() {
  reachable_.assign(reachable_.size(), true);
  work_.reset();
  ready_ = true;
  local_.zero_();
}

void UnusedParams::shadow(bool map, comm::ProcessGroup& pg) {
  if (map) {
    local_.zero_();
    if (on_device_) wire_.zero_();
    const comm::ForPurpose purpose({comm::Purpose::kControl});
    pg.wait(pg.allreduce_sum_async(wire_), "join: all-reduce of the used-parameter map");
  }
  local_.zero_();
}

}  // namespace ddp::gradients
