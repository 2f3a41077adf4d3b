// tools/trace-svg, run as a user runs it: a Chrome trace in, an SVG out. To look at what it draws,
// open the SVG in a browser (or `rsvg-convert out.svg -o out.png`).

#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::read_file;
using ddp::testing::TempDir;
using ddp::testing::write_file;

namespace fs = std::filesystem;

// The documented horizontal layout (tools/trace-svg/timeline_svg.hpp): the plot spans
// [kLeftMargin, width - kRightMargin], time 0 is the earliest event's start.
constexpr double kLeftMargin = 140;
constexpr double kRightMargin = 30;

// The shared helper: stdout+stderr and exit status.
auto run(const std::string& command) { return ddp::testing::run_command(command); }

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

// Events as ddp-bench --profile writes them; times in microseconds on an absolute clock.
struct Ev {
  const char* name;
  const char* cat;
  int pid, tid;
  double start_ms, dur_ms;  // from the first event
};

// Two ranks x (forward, backward, 2 buckets, optimizer). The last event ends at 100 ms.
constexpr Ev kEvents[] = {
    {"forward", "compute", 0, 0, 0, 20},   {"backward", "compute", 0, 0, 20, 40},
    {"bucket 0", "comm", 0, 1, 35, 15},    {"bucket 1", "comm", 0, 1, 52, 10},
    {"optimizer", "compute", 0, 0, 62, 8}, {"forward", "compute", 1, 0, 1, 21},
    {"backward", "compute", 1, 0, 22, 40}, {"bucket 0", "comm", 1, 1, 38, 14},
    {"bucket 1", "comm", 1, 1, 54, 12},    {"optimizer", "compute", 1, 0, 66, 34},
};
constexpr double kBaseUs = 7'000'000'000;  // a steady clock's microseconds: not zero-based
constexpr double kTraceEndMs = 100;

std::string trace_json() {
  std::ostringstream j;
  j.precision(17);
  j << "{\"traceEvents\": [\n";
  for (int r = 0; r < 2; ++r)
    j << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << r
      << ", \"args\": {\"name\": \"rank " << r << "\"}},\n";
  // An instant event and a counter: other phases are ignored.
  j << "{\"ph\": \"i\", \"name\": \"mark\", \"ts\": " << kBaseUs << ", \"pid\": 0, \"tid\": 0},\n";
  j << "{\"ph\": \"C\", \"name\": \"mem\", \"ts\": " << kBaseUs << ", \"pid\": 0, \"args\": {}},\n";
  for (size_t i = 0; i < std::size(kEvents); ++i) {
    const Ev& e = kEvents[i];
    j << (i ? ",\n" : "") << "{\"name\": \"" << e.name << "\", \"cat\": \"" << e.cat
      << "\", \"ph\": \"X\", \"ts\": " << kBaseUs + e.start_ms * 1000
      << ", \"dur\": " << e.dur_ms * 1000 << ", \"pid\": " << e.pid << ", \"tid\": " << e.tid
      << ", \"args\": {\"step\": 0}}";
  }
  j << "], \"displayTimeUnit\": \"ms\"}\n";
  return j.str();
}

// The value of attribute `name` in the tag that starts at `tag_begin`.
double attr(const std::string& svg, size_t tag_begin, const std::string& name) {
  const size_t tag_end = svg.find('>', tag_begin);
  const size_t pos = svg.find(" " + name + "=\"", tag_begin);
  if (pos == std::string::npos || pos > tag_end) return -1;
  return std::stod(svg.substr(pos + name.size() + 3));
}

// The bar whose tooltip begins "<name> (rank <r>)": its x and width.
std::pair<double, double> bar(const std::string& svg, const std::string& name, int rank) {
  const size_t title = svg.find("<title>" + name + " (rank " + std::to_string(rank) + ")\n");
  if (title == std::string::npos) return {-1, -1};
  const size_t rect = svg.rfind("<rect class=\"bar\"", title);
  return {attr(svg, rect, "x"), attr(svg, rect, "width")};
}

std::string trim_end(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

TEST(TraceSvg, DrawsOneBarPerEventAtTheDocumentedScale) {
  TempDir dir;
  write_file(dir.file("profile.json"), trace_json());
  const auto [out, code] = run(std::string(TRACE_SVG_PATH) + " " + dir.file("profile.json") +
                               " -o " + dir.file("profile.svg"));
  ASSERT_EQ(code, 0) << out;
  const std::string svg = read_file(dir.file("profile.svg"));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 200);
  EXPECT_TRUE(trim_end(svg).size() >= 6 &&
              trim_end(svg).substr(trim_end(svg).size() - 6) == "</svg>");

  // Documented count: 1 background + 2 lanes per rank + 1 per event + 1 legend swatch per name.
  const size_t events = std::size(kEvents), ranks = 2, names = 5;
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), events);
  EXPECT_EQ(count(svg, "<rect"), 1 + 2 * ranks + events + names);
  EXPECT_EQ(count(svg, "<title>"), events);
  EXPECT_NE(svg.find(">rank 0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">rank 1</text>"), std::string::npos);
  EXPECT_NE(svg.find(">compute</text>"), std::string::npos);
  EXPECT_NE(svg.find(">comm</text>"), std::string::npos);
  EXPECT_NE(svg.find(">50 ms</text>"), std::string::npos);  // a tick of the time axis
  EXPECT_NE(svg.find("start 22.000 ms\nduration 40.000 ms\nstep: 0</title>"), std::string::npos);

  // Every bar at x = left + t * scale, width d * scale, scale = plot width / trace length.
  const double scale = (1600 - kLeftMargin - kRightMargin) / kTraceEndMs;
  for (const Ev& e : kEvents) {
    const auto [x, w] = bar(svg, e.name, e.pid);
    EXPECT_NEAR(x, kLeftMargin + e.start_ms * scale, 0.002) << e.name << " rank " << e.pid;
    EXPECT_NEAR(w, e.dur_ms * scale, 0.002) << e.name << " rank " << e.pid;
  }
  // Lanes: a comm bar lies in the lane below its rank's compute bars.
  const size_t fwd = svg.rfind("<rect", svg.find("<title>forward (rank 0)"));
  const size_t comm = svg.rfind("<rect", svg.find("<title>bucket 0 (rank 0)"));
  EXPECT_GT(attr(svg, comm, "y"), attr(svg, fwd, "y"));
}

TEST(TraceSvg, WindowClipsAndRescales) {
  TempDir dir;
  write_file(dir.file("profile.json"), trace_json());
  const auto [out, code] =
      run(std::string(TRACE_SVG_PATH) + " " + dir.file("profile.json") + " -o " +
          dir.file("w.svg") + " --width 1000 --from-ms 20 --to-ms 60");
  ASSERT_EQ(code, 0) << out;
  const std::string svg = read_file(dir.file("w.svg"));
  const double scale = (1000 - kLeftMargin - kRightMargin) / 40.0;
  // Inside (20, 60): rank 0 backward, both buckets; rank 1 forward (clipped), backward, buckets.
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 7u);
  auto [x, w] = bar(svg, "backward", 0);
  EXPECT_NEAR(x, kLeftMargin, 0.002);
  EXPECT_NEAR(w, 40 * scale, 0.002);
  std::tie(x, w) = bar(svg, "forward", 1);  // 1..22 ms, clipped to 20..22
  EXPECT_NEAR(x, kLeftMargin, 0.002);
  EXPECT_NEAR(w, 2 * scale, 0.002);
  std::tie(x, w) = bar(svg, "bucket 1", 1);  // 54..66 ms, clipped to 54..60
  EXPECT_NEAR(x, kLeftMargin + 34 * scale, 0.002);
  EXPECT_NEAR(w, 6 * scale, 0.002);
}

TEST(TraceSvg, BadInputNamesTheFileAndExitsOne) {
  TempDir dir;
  const std::string bad = dir.file("broken.json");
  write_file(bad, "{\"traceEvents\": [ {\"ph\": \"X\", ");
  auto [out, code] = run(std::string(TRACE_SVG_PATH) + " " + bad + " -o " + dir.file("x.svg"));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("'" + bad + "' is not valid JSON"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir.file("x.svg")));

  const std::string missing = dir.file("missing.json");
  std::tie(out, code) =
      run(std::string(TRACE_SVG_PATH) + " " + missing + " -o " + dir.file("x.svg"));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("cannot open '" + missing + "'"), std::string::npos) << out;

  const std::string empty = dir.file("empty.json");
  write_file(empty, R"({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0}]})");
  std::tie(out, code) = run(std::string(TRACE_SVG_PATH) + " " + empty + " -o " + dir.file("x.svg"));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("'" + empty + "': no complete (\"ph\": \"X\") events"), std::string::npos)
      << out;

  const std::string no_ts = dir.file("no_ts.json");
  write_file(no_ts, R"({"traceEvents": [{"ph": "X", "name": "forward", "pid": 0, "dur": 5}]})");
  std::tie(out, code) = run(std::string(TRACE_SVG_PATH) + " " + no_ts + " -o " + dir.file("x.svg"));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("traceEvents[0] (\"forward\"): \"ts\" is missing"), std::string::npos) << out;

  const std::string good = dir.file("good.json");
  write_file(good, trace_json());
  std::tie(out, code) = run(std::string(TRACE_SVG_PATH) + " " + good + " -o " + dir.file("x.svg") +
                            " --from-ms 50 --to-ms 10");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("the window ends at 10.000 ms, not after its start 50.000 ms"),
            std::string::npos)
      << out;
}

}  // namespace
