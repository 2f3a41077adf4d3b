#include "common/init_report.hpp"

#include <sys/resource.h>

#include "ddp/comm/control_scalars.hpp"

namespace ddp::tools {

int64_t resident_peak_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux counts kilobytes
}

InitReport gather_init_report(const comm::ProcessGroupPtr& world,
                              std::chrono::steady_clock::time_point start) {
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  const int64_t peak = resident_peak_bytes();
  InitReport report;
  if (!world) {
    report.seconds = {static_cast<double>(us) / 1e6};
    report.peak_bytes = {peak};
    return report;
  }
  // One slot pair a rank, zero but this rank's: a sum is the gather.
  const int n = world->world_size();
  std::vector<int64_t> slots(2 * static_cast<size_t>(n), 0);
  slots[2 * static_cast<size_t>(world->rank())] = us;
  slots[2 * static_cast<size_t>(world->rank()) + 1] = peak;
  at::Tensor t = comm::control_tensor(*world, slots);
  world->allreduce_sum(t, "the ranks' initialisation reports");
  const std::vector<int64_t> all = comm::read_scalars(t);
  for (int r = 0; r < n; ++r) {
    report.seconds.push_back(static_cast<double>(all[2 * static_cast<size_t>(r)]) / 1e6);
    report.peak_bytes.push_back(all[2 * static_cast<size_t>(r) + 1]);
  }
  return report;
}

}  // namespace ddp::tools
