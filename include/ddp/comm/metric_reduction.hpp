#pragma once
// A metric over the whole group from each rank's part: the sum of a per-sample quantity (a loss, a
// count of correct answers) and the number of samples it covers, added across the ranks in one
// all-reduce (float64), so the mean weighs every sample once whatever each rank held. A rank with
// no samples passes 0 and 0. Padding: a DistributedSampler without drop_last repeats samples to
// give every rank samples_per_rank(); count only the first real_samples() of a rank's epoch
// (data/distributed_sampler.hpp) and the repeated ones weigh nothing.
//
//   double sum = 0; int64_t count = 0;
//   ... sum += loss(net->forward(x), y).item<double>() * x.size(0); count += x.size(0);
//   const ddp::comm::MetricTotal total = ddp::comm::reduce_metric(*group, sum, count, "val loss");
//   total.mean();  // the same value on every rank

#include <cstdint>
#include <string>

#include "ddp/comm/process_group.hpp"

namespace ddp::comm {

struct MetricTotal {
  double sum = 0;
  int64_t count = 0;
  // sum / count; NaN when no rank had a sample (no value to report, rather than a made-up 0).
  double mean() const;
};

// Collective: every rank of `group` calls it; `what` names it in an error.
MetricTotal reduce_metric(ProcessGroup& group, double sum, int64_t count,
                          const std::string& what = "metric");

}  // namespace ddp::comm
