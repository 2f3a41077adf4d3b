#include "ddp/comm/metric_reduction.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>

#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::comm {

double MetricTotal::mean() const {
  return count == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(count);
}

MetricTotal reduce_metric(ProcessGroup& group, double sum, int64_t count, const std::string& what) {
  TORCH_CHECK(count >= 0, "ddp::comm::reduce_metric: ", what, ": a count of ", count,
              " samples (must be >= 0)");
  // float64 holds counts exactly up to 2^53 and the sums as the caller computed them.
  at::Tensor both = at::tensor({sum, static_cast<double>(count)}, at::kDouble).to(group.device());
  {
    const ForPurpose purpose({Purpose::kControl});
    group.allreduce_sum(both, "all-reduce of " + what + " (sum and count)");
  }
  const at::Tensor host = both.cpu();
  return {host[0].item<double>(), static_cast<int64_t>(host[1].item<double>())};
}

}  // namespace ddp::comm
