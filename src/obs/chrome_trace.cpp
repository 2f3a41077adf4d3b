#include "ddp/obs/chrome_trace.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace ddp::obs {

int64_t trace_now_ns() { return steady_ns(); }

void ChromeTrace::add_buckets(const obs::IterationTimeline& t, const buckets::BucketPlan& plan,
                              int64_t step) {
  for (size_t b = 0; b < t.bucket_launch_ns.size() && b < plan.buckets.size(); ++b) {
    const int64_t launch = t.bucket_launch_ns[b];
    int64_t done = b < t.bucket_comm_done_ns.size() ? t.bucket_comm_done_ns[b] : -1;
    if (done < 0 && b < t.bucket_done_ns.size()) done = t.bucket_done_ns[b];
    if (launch < 0 || done < launch) continue;
    add({"bucket " + std::to_string(b), "comm", 1, t.backward_start_ns + launch,
         t.backward_start_ns + done, step, static_cast<int64_t>(plan.buckets[b].bytes)});
  }
}

namespace {

nlohmann::json events(const std::vector<TraceSpan>& spans, int rank, int64_t origin_ns) {
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"name", "process_name"},
                 {"ph", "M"},
                 {"pid", rank},
                 {"args", {{"name", "rank " + std::to_string(rank)}}}});
  out.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", rank},
                 {"tid", 0},
                 {"args", {{"name", "compute"}}}});
  out.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", rank},
                 {"tid", 1},
                 {"args", {{"name", "comm"}}}});
  for (const auto& s : spans) {
    nlohmann::json args = nlohmann::json::object();
    if (s.step >= 0) args["step"] = s.step;
    if (s.bytes >= 0) args["bytes"] = s.bytes;
    out.push_back({{"name", s.name},
                   {"cat", s.cat},
                   {"ph", "X"},
                   {"ts", static_cast<double>(s.start_ns - origin_ns) / 1e3},
                   {"dur", static_cast<double>(s.end_ns - s.start_ns) / 1e3},
                   {"pid", rank},
                   {"tid", s.lane},
                   {"args", args}});
  }
  return out;
}

void write_file(const std::string& path, const nlohmann::json& all) {
  nlohmann::json doc = {{"traceEvents", all}, {"displayTimeUnit", "ms"}};
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "ddp: cannot write trace file '", path, "'");
  out << doc.dump() << "\n";
  TORCH_CHECK(out.good(), "ddp: writing trace file '", path, "' failed");
}

int64_t earliest(const std::vector<TraceSpan>& spans) {
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const auto& s : spans) first = std::min(first, s.start_ns);
  return first;
}

}  // namespace

std::string ChromeTrace::events_json(int64_t origin_ns) const {
  return events(spans_, rank_, origin_ns).dump();
}

void ChromeTrace::write(const std::string& path) const {
  write_file(path, events(spans_, rank_, spans_.empty() ? 0 : earliest(spans_)));
}

void ChromeTrace::write_merged(comm::ProcessGroup& pg, const std::string& path) const {
  // Absolute times travel (ns as text); rank 0 picks the common origin. The steady clock is one
  // clock per host, so ranks on one host line up exactly. Keys are under the group's store prefix.
  const std::string prefix = "trace/" + std::to_string(pg.next_exchange_id()) + "/";
  const std::string mine = events(spans_, rank_, 0).dump();
  pg.store().set(prefix + std::to_string(pg.rank()),
                 std::vector<uint8_t>(mine.begin(), mine.end()));
  if (pg.rank() == 0) {
    std::vector<nlohmann::json> per_rank;
    double origin_us = std::numeric_limits<double>::max();
    for (int r = 0; r < pg.world_size(); ++r) {
      const auto bytes = pg.store().get(prefix + std::to_string(r));
      per_rank.push_back(nlohmann::json::parse(std::string(bytes.begin(), bytes.end())));
      for (const auto& e : per_rank.back()) {
        if (e.value("ph", "") == "X") origin_us = std::min(origin_us, e["ts"].get<double>());
      }
    }
    if (origin_us == std::numeric_limits<double>::max()) origin_us = 0;
    nlohmann::json all = nlohmann::json::array();
    for (auto& events_of_rank : per_rank) {
      for (auto& e : events_of_rank) {
        if (e.value("ph", "") == "X") e["ts"] = e["ts"].get<double>() - origin_us;
        all.push_back(e);
      }
    }
    write_file(path, all);
  }
  pg.barrier("trace write");
}

}  // namespace ddp::obs
