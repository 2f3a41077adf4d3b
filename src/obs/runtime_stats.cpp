#include "ddp/obs/runtime_stats.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <utility>

namespace ddp::obs {

bool should_sample(int64_t iteration, int64_t every) {
  return iteration >= 1 && (iteration <= 10 || (every > 0 && iteration % every == 0));
}

IterationStats stats_from_timeline(const obs::IterationTimeline& t, int64_t forward_compute_ns) {
  IterationStats s;
  s.iteration = t.iteration;
  s.forward_compute_ns = forward_compute_ns;
  s.param_ready_ns = t.param_ready_ns;
  s.backward_compute_ns = 0;
  for (int64_t r : t.param_ready_ns) s.backward_compute_ns = std::max(s.backward_compute_ns, r);
  std::vector<std::pair<int64_t, int64_t>> intervals;
  for (size_t b = 0; b < t.bucket_launch_ns.size(); ++b) {
    const int64_t start = t.bucket_launch_ns[b];
    int64_t end = b < t.bucket_comm_done_ns.size() ? t.bucket_comm_done_ns[b] : -1;
    if (end < 0 && b < t.bucket_done_ns.size()) end = t.bucket_done_ns[b];
    if (start >= 0 && end >= start) intervals.emplace_back(start, end);
  }
  if (intervals.empty()) return s;
  std::sort(intervals.begin(), intervals.end());
  int64_t first = intervals.front().first, last = 0;
  // Merge, then clip to [0, compute end] for the overlap.
  int64_t cur_start = intervals.front().first, cur_end = intervals.front().second;
  auto add_overlap = [&](int64_t a, int64_t b) {
    const int64_t hi = std::min(b, s.backward_compute_ns);
    if (hi > a) s.backward_overlap_ns += hi - a;
  };
  for (size_t i = 1; i < intervals.size(); ++i) {
    if (intervals[i].first <= cur_end) {
      cur_end = std::max(cur_end, intervals[i].second);
    } else {
      add_overlap(cur_start, cur_end);
      last = std::max(last, cur_end);
      cur_start = intervals[i].first;
      cur_end = intervals[i].second;
    }
  }
  add_overlap(cur_start, cur_end);
  last = std::max(last, cur_end);
  s.backward_comm_ns = last - first;
  return s;
}

void summarize(LoggingData& d) {
  d.avg_forward_compute_ns = d.avg_backward_compute_ns = d.avg_backward_comm_ns =
      d.avg_backward_overlap_ns = 0;
  if (d.samples.empty()) return;
  for (const auto& s : d.samples) {
    d.avg_forward_compute_ns += s.forward_compute_ns;
    d.avg_backward_compute_ns += s.backward_compute_ns;
    d.avg_backward_comm_ns += s.backward_comm_ns;
    d.avg_backward_overlap_ns += s.backward_overlap_ns;
  }
  const double n = static_cast<double>(d.samples.size());
  d.avg_forward_compute_ns /= n;
  d.avg_backward_compute_ns /= n;
  d.avg_backward_comm_ns /= n;
  d.avg_backward_overlap_ns /= n;
}

std::string format_summary(const LoggingData& d) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3);
  // The sharded styles describe their options with a "style" entry; DDP's have none.
  const auto style = d.options.find("style");
  out << (style != d.options.end() ? style->second : std::string("DDP")) << " runtime stats (rank "
      << d.rank << " of " << d.world_size << ", " << d.backend << ", hook " << d.comm_hook << ", "
      << d.bucket_sizes.size() << " buckets, " << d.iterations << " iterations, "
      << d.samples.size() << " sampled)\n";
  size_t count[2] = {0, 0};
  size_t bytes[2] = {0, 0};
  for (size_t b = 0; b < d.bucket_reductions.size() && b < d.bucket_sizes.size(); ++b) {
    const size_t k = d.bucket_reductions[b] == buckets::Reduction::kAllReduce ? 0 : 1;
    ++count[k];
    bytes[k] += d.bucket_sizes[b];
  }
  if (count[0] + count[1] > 0) {
    out << "  buckets           ";
    if (count[0] > 0) out << count[0] << " all-reduced (" << bytes[0] << " bytes)";
    if (count[0] > 0 && count[1] > 0) out << ", ";
    if (count[1] > 0) out << count[1] << " reduce-scattered (" << bytes[1] << " bytes)";
    out << "\n";
  }
  out << "  forward compute   " << d.avg_forward_compute_ns / 1e6 << " ms\n";
  out << "  backward compute  " << d.avg_backward_compute_ns / 1e6 << " ms\n";
  out << "  backward comm     " << d.avg_backward_comm_ns / 1e6 << " ms\n";
  out << "  comm overlapped   " << d.avg_backward_overlap_ns / 1e6 << " ms";
  if (d.avg_backward_comm_ns > 0) {
    out << " (" << std::setprecision(1)
        << 100.0 * d.avg_backward_overlap_ns / d.avg_backward_comm_ns << "% of comm)";
  }
  out << "\n";
  return out.str();
}

}  // namespace ddp::obs
