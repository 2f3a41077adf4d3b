#include "timeline_svg.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/svg.hpp"

namespace ddp::tools {
namespace {

using json = nlohmann::json;
using svg::escape;
using svg::kSwatch;
using LegendEntry = svg::LegendEntry;
using svg::number;

// Vertical geometry (px), below the shared heading (common/svg.hpp). A lane is tall enough for an
// 11 px label inside a bar.
constexpr double kTickLabelBaseline = 72;
constexpr double kAxisY = 80;
constexpr double kRowsTop = 88;
constexpr double kLaneHeight = 22;
constexpr double kLaneGap = 3;
constexpr double kRowGap = 12;
constexpr double kRowHeight = 2 * kLaneHeight + kLaneGap;
constexpr double kLegendGap = 26;
// More names than this (a per-step name, say) would bury the picture under its legend.
constexpr size_t kMaxLegendEntries = 48;
// A rough width of one character, to decide whether a label fits in a bar (no font metrics here).
constexpr double kCharWidth11 = 6.3;

struct Bar {
  std::string name;
  std::string cat;
  int64_t pid = 0;
  int lane = 0;  // 0 compute, 1 comm
  double start_ms = 0, dur_ms = 0;
  json args;
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The first integer in a name ("bucket 12" -> 12), -1 if none: orders and shades the buckets.
int64_t first_number(const std::string& name) {
  const auto pos = name.find_first_of("0123456789");
  if (pos == std::string::npos) return -1;
  int64_t n = 0;
  for (size_t i = pos; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    n = std::min<int64_t>(n * 10 + (name[i] - '0'), std::numeric_limits<int32_t>::max());
  return n;
}

// Palettes after Tableau 10: distinct at a glance and legible for the common colour-vision
// deficiencies in the pairs that share a lane (blue/green/purple for compute).
constexpr const char* kForward = "#4e79a7";
constexpr const char* kBackward = "#59a14f";
constexpr const char* kOptimizer = "#b07aa1";
constexpr const char* kOtherCompute[] = {"#9c755f", "#edc948", "#76b7b2", "#bab0ac", "#ff9da7"};
// Communication: one red-orange family, dark and light alternating by bucket number.
constexpr const char* kComm[] = {"#d62728", "#fd8d3c", "#a50f15", "#fdae6b", "#e6550d", "#fb6a4a"};

// Which of the fixed compute kinds a name is: 0 forward, 1 backward, 2 optimizer, -1 another.
int compute_kind(const std::string& name) {
  const std::string n = lower(name);
  if (n.find("forward") != std::string::npos || n == "fwd") return 0;
  if (n.find("backward") != std::string::npos || n == "bwd") return 1;
  if (n.find("optim") != std::string::npos || n == "step") return 2;
  return -1;
}

// Text on a bar: dark on light fills, white on dark ones.
const char* text_colour(const std::string& fill) {
  const auto channel = [&](int i) { return std::stoi(fill.substr(1 + 2 * i, 2), nullptr, 16); };
  const double luma = 0.299 * channel(0) + 0.587 * channel(1) + 0.114 * channel(2);
  return luma > 150 ? "#1f1f1f" : "#ffffff";
}

// One colour per event name, and the legend's order: forward, backward, optimizer, other compute
// names by first start, then the comm names by bucket number.
std::vector<LegendEntry> assign_colours(const std::vector<Bar>& bars_by_start) {
  std::vector<std::string> fixed[3], other, comm;
  std::set<std::string> seen;
  for (const Bar& b : bars_by_start) {
    if (!seen.insert(b.name).second) continue;
    if (b.cat == "comm") {
      comm.push_back(b.name);
    } else if (const int kind = compute_kind(b.name); kind >= 0) {
      fixed[kind].push_back(b.name);
    } else {
      other.push_back(b.name);
    }
  }
  std::stable_sort(comm.begin(), comm.end(), [](const std::string& a, const std::string& b) {
    return std::make_pair(first_number(a), a) < std::make_pair(first_number(b), b);
  });
  std::vector<LegendEntry> out;
  const char* fixed_colour[3] = {kForward, kBackward, kOptimizer};
  for (int k = 0; k < 3; ++k)
    for (const std::string& n : fixed[k]) out.push_back({n, fixed_colour[k], ""});
  for (size_t i = 0; i < other.size(); ++i)
    out.push_back({other[i], kOtherCompute[i % std::size(kOtherCompute)], ""});
  for (size_t i = 0; i < comm.size(); ++i) {
    const int64_t n = first_number(comm[i]);
    const size_t shade = n >= 0 ? size_t(n) : i;
    out.push_back({comm[i], kComm[shade % std::size(kComm)], ""});
  }
  return out;
}

double number_field(const json& ev, const char* key, size_t index, bool required,
                    double fallback = 0) {
  const auto it = ev.find(key);
  if (it == ev.end() && !required) return fallback;
  if (it == ev.end() || !it->is_number()) {
    throw TraceError("traceEvents[" + std::to_string(index) + "] (\"" +
                     ev.value("name", std::string("?")) + "\"): \"" + key + "\" is " +
                     (it == ev.end() ? "missing" : "not a number but " + it->dump()));
  }
  return it->get<double>();
}

}  // namespace

std::string render_timeline_svg(const json& trace, const SvgOptions& options) {
  const double width = options.width;
  const double plot_width = width - kLeftMargin - kRightMargin;
  if (!(plot_width >= 100)) {
    throw std::invalid_argument("width " + number(width, 0) +
                                " px leaves no room for the plot (at least " +
                                number(kLeftMargin + kRightMargin + 100, 0) + " px)");
  }

  const json* events = &trace;
  if (trace.is_object()) {
    const auto it = trace.find("traceEvents");
    if (it == trace.end() || !it->is_array())
      throw TraceError("no \"traceEvents\" list at the top level");
    events = &*it;
  } else if (!trace.is_array()) {
    throw TraceError(
        "the top level is neither an object with \"traceEvents\" nor a list of events");
  }

  // Events: complete ones become bars (µs -> ms), process_name metadata labels the rows.
  std::vector<Bar> bars;
  std::map<int64_t, std::string> labels;
  std::set<int64_t> pids;
  double origin_us = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < events->size(); ++i) {
    const json& ev = (*events)[i];
    if (!ev.is_object()) continue;
    const std::string ph = ev.value("ph", std::string());
    if (ph == "M") {
      const auto args = ev.find("args");
      if (ev.value("name", std::string()) == "process_name" && ev.contains("pid") &&
          ev["pid"].is_number_integer() && args != ev.end() && args->is_object() &&
          args->contains("name") && (*args)["name"].is_string()) {
        labels[ev["pid"].get<int64_t>()] = (*args)["name"].get<std::string>();
        pids.insert(ev["pid"].get<int64_t>());
      }
      continue;
    }
    if (ph != "X") continue;
    Bar b;
    const auto name = ev.find("name");
    b.name = name != ev.end() && name->is_string() ? name->get<std::string>() : "(unnamed)";
    const auto cat = ev.find("cat");
    b.cat = cat != ev.end() && cat->is_string() ? cat->get<std::string>() : "";
    const double ts = number_field(ev, "ts", i, true);
    const double dur = number_field(ev, "dur", i, false);
    if (dur < 0) {
      throw TraceError("traceEvents[" + std::to_string(i) + "] (\"" + b.name + "\"): \"dur\" " +
                       number(dur) + " is negative");
    }
    b.pid = int64_t(number_field(ev, "pid", i, true));
    const int64_t tid = int64_t(number_field(ev, "tid", i, false));
    b.lane = tid == 0 ? 0 : tid == 1 ? 1 : b.cat == "comm" ? 1 : 0;
    b.start_ms = ts;  // still µs; made relative below
    b.dur_ms = dur / 1000;
    if (const auto args = ev.find("args"); args != ev.end() && args->is_object()) b.args = *args;
    origin_us = std::min(origin_us, ts);
    pids.insert(b.pid);
    bars.push_back(std::move(b));
  }
  if (bars.empty()) throw TraceError("no complete (\"ph\": \"X\") events in the trace");
  double end_ms = 0;
  for (Bar& b : bars) {
    b.start_ms = (b.start_ms - origin_us) / 1000;
    end_ms = std::max(end_ms, b.start_ms + b.dur_ms);
  }
  // Shorter bars after longer ones that start together: a nested span is drawn on top.
  std::stable_sort(bars.begin(), bars.end(), [](const Bar& a, const Bar& b) {
    return a.start_ms != b.start_ms ? a.start_ms < b.start_ms : a.dur_ms > b.dur_ms;
  });

  const double from = options.from_ms.value_or(0);
  double to = options.to_ms.value_or(std::max(end_ms, from));
  if (options.to_ms && !(to > from)) {
    throw std::invalid_argument("the window ends at " + number(to) + " ms, not after its start " +
                                number(from) + " ms");
  }
  if (!(to > from)) to = from + 1;                // every event instantaneous: a 1 ms axis
  const double scale = plot_width / (to - from);  // px per ms
  const auto x_of = [&](double ms) { return kLeftMargin + (ms - from) * scale; };

  std::map<int64_t, size_t> row_of;
  for (const int64_t pid : pids) row_of.emplace(pid, row_of.size());
  const auto lane_y = [&](int64_t pid, int lane) {
    return kRowsTop + double(row_of.at(pid)) * (kRowHeight + kRowGap) +
           lane * (kLaneHeight + kLaneGap);
  };
  const double rows_bottom = kRowsTop + double(pids.size()) * (kRowHeight + kRowGap) - kRowGap;

  std::vector<const Bar*> drawn;
  for (const Bar& b : bars) {
    const double end = b.start_ms + b.dur_ms;
    const bool visible =
        b.dur_ms > 0 ? (b.start_ms < to && end > from) : (b.start_ms >= from && b.start_ms <= to);
    if (visible) drawn.push_back(&b);
  }
  const std::vector<LegendEntry> legend = assign_colours(bars);
  std::map<std::string, std::string> colour;
  for (const LegendEntry& e : legend) colour[e.name] = e.colour;

  // Legend rows: entries flow left to right and wrap at the right margin.
  const size_t legend_shown = std::min(legend.size(), kMaxLegendEntries);
  const svg::LegendLayout legend_at =
      svg::layout_legend(legend, legend_shown, 12, rows_bottom + kLegendGap, width - kRightMargin);
  const double height = legend_at.bottom + 20;

  std::ostringstream svg;
  svg << svg::open(width, height);
  svg << svg::title(options.title);
  svg << svg::subtitle(std::to_string(pids.size()) + (pids.size() == 1 ? " rank, " : " ranks, ") +
                       std::to_string(bars.size()) + " events; showing " + number(from) + " to " +
                       number(to) + " ms after the first event; hover a bar for details");

  // Lanes first, then the grid over them, then the bars over the grid.
  svg << "<g id=\"lanes\">\n";
  for (const int64_t pid : pids) {
    const auto label = labels.find(pid);
    const std::string rank = label != labels.end() ? label->second : "rank " + std::to_string(pid);
    const double top = lane_y(pid, 0);
    svg << "<text x=\"12\" y=\"" << number(top + kRowHeight / 2 + 5)
        << "\" font-size=\"14\" font-weight=\"bold\" fill=\"#1f1f1f\">" << escape(rank)
        << "</text>\n";
    for (int lane = 0; lane < 2; ++lane) {
      const double y = lane_y(pid, lane);
      svg << "<rect x=\"" << number(kLeftMargin) << "\" y=\"" << number(y) << "\" width=\""
          << number(plot_width) << "\" height=\"" << number(kLaneHeight) << "\" fill=\""
          << (lane == 0 ? "#eef2f7" : "#f8efea") << "\"/>\n";
      svg << "<text x=\"" << number(kLeftMargin - 8) << "\" y=\"" << number(y + kLaneHeight / 2 + 4)
          << "\" font-size=\"11\" fill=\"#555555\" text-anchor=\"end\">"
          << (lane == 0 ? "compute" : "comm") << "</text>\n";
    }
  }
  svg << "</g>\n";

  const svg::Ticks ticks = svg::ticks(from, to, plot_width);
  svg << "<g id=\"axis\" font-size=\"11\" fill=\"#444444\" text-anchor=\"middle\">\n";
  svg << svg::line(kLeftMargin, kAxisY, kLeftMargin + plot_width, kAxisY, "#888888");
  for (const double t : ticks.values) {
    const double x = x_of(t);
    svg << svg::line(x, kAxisY - 4, x, rows_bottom, "#c8ccd2", 0.7);
    svg << "<text x=\"" << number(x) << "\" y=\"" << number(kTickLabelBaseline) << "\">"
        << number(t, ticks.decimals) << " ms</text>\n";
  }
  svg << "</g>\n";

  // Spans of one lane may overlap (a bucket launched while the previous one is still in flight):
  // a label stops where the next bar of its lane starts, so no later bar cuts it off.
  std::vector<double> room(drawn.size(), std::numeric_limits<double>::infinity());
  std::map<std::pair<int64_t, int>, double> next_x;
  for (size_t i = drawn.size(); i-- > 0;) {
    const std::pair<int64_t, int> lane{drawn[i]->pid, drawn[i]->lane};
    const double x = x_of(std::max(drawn[i]->start_ms, from));
    if (const auto it = next_x.find(lane); it != next_x.end()) room[i] = it->second - x;
    next_x[lane] = x;
  }

  svg << "<g id=\"bars\">\n";
  for (size_t i = 0; i < drawn.size(); ++i) {
    const Bar* b = drawn[i];
    const double start = std::max(b->start_ms, from);
    const double end = std::min(b->start_ms + b->dur_ms, to);
    const double x = x_of(start);
    const double w = std::max((end - start) * scale, kMinBarWidth);
    const double y = lane_y(b->pid, b->lane);
    const std::string& fill = colour.at(b->name);
    const auto label = labels.find(b->pid);
    const std::string rank =
        label != labels.end() ? label->second : "rank " + std::to_string(b->pid);
    std::string tip = b->name + " (" + rank + ")\nstart " + number(b->start_ms) + " ms\nduration " +
                      number(b->dur_ms) + " ms";
    for (const auto& [key, value] : b->args.items())
      tip += "\n" + key + ": " + (value.is_string() ? value.get<std::string>() : value.dump());
    svg << "<rect class=\"bar\" x=\"" << number(x) << "\" y=\"" << number(y + 1) << "\" width=\""
        << number(w) << "\" height=\"" << number(kLaneHeight - 2) << "\" fill=\"" << fill
        << "\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>" << escape(tip)
        << "</title></rect>\n";
    // The name inside the bar when it fits; the text lets the pointer through to the bar's title.
    if (std::min(w, room[i]) >= double(b->name.size()) * kCharWidth11 + 8) {
      svg << "<text x=\"" << number(x + 4) << "\" y=\"" << number(y + kLaneHeight / 2 + 4)
          << "\" font-size=\"11\" fill=\"" << text_colour(fill) << "\" pointer-events=\"none\">"
          << escape(b->name) << "</text>\n";
    }
  }
  svg << "</g>\n";

  svg << "<g id=\"legend\" font-size=\"12\" fill=\"#1f1f1f\">\n";
  svg << svg::legend_items(legend, legend_at);
  if (legend.size() > legend_shown) {
    svg << "<text x=\"" << number(legend_at.end_x) << "\" y=\""
        << number(legend_at.end_y + kSwatch - 1) << "\" fill=\"#666666\">+ "
        << legend.size() - legend_shown << " more names</text>\n";
  }
  svg << "</g>\n";
  svg << svg::close();
  return svg.str();
}

}  // namespace ddp::tools
