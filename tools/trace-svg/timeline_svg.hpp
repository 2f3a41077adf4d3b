#pragma once
// A Chrome trace (as ddp-bench --profile writes it, see include/ddp/obs/chrome_trace.hpp) drawn as
// an SVG timeline. View it by opening the .svg in a browser; hovering a bar shows its name, rank,
// start, duration and args.
//
// Layout, top to bottom (all numbers in SVG pixels):
//
//   title                                       subtitle: ranks, events, window
//          |0 ms      |5 ms      |10 ms  ...    time axis, ticks every 1/2/5 x 10^k ms
//   rank 0  compute  [forward ][backward     ]  [opt]
//           comm               [b1 ][b0   ]
//   rank 1  compute  ...
//           comm     ...
//   [■ forward] [■ backward] [■ optimizer] [■ bucket 0] ...   legend, one swatch per event name
//
// Horizontal scale: time 0 is the start of the earliest complete event of the trace; the window is
// [from_ms, to_ms] (default: 0 to the end of the last event). With W = width - kLeftMargin -
// kRightMargin, an event starting at t ms lasting d ms has
//   x = kLeftMargin + (t - from_ms) * W / (to_ms - from_ms),   width = d * W / (to_ms - from_ms)
// clipped to the window, and at least kMinBarWidth so a short bucket stays visible. Coordinates
// are printed with 3 decimals.
//
// Element counts (what a test can rely on): every <rect> is one of
//   1 page background + 2 per rank row (the lane backgrounds) + 1 per complete event drawn
//   (class="bar", an event inside the window) + 1 per legend swatch (one per distinct event name).
// Bars carry a <title> whose first line is "<name> (<rank label>)".
//
// Lanes: tid 0 is compute, tid 1 is comm; another tid goes to comm when cat is "comm", else to
// compute. Colours are keyed by name: forward blue, backward green, optimizer purple, other compute
// names from a muted palette, and every "comm" event in one red-orange family, alternating dark
// and light shades by bucket number so neighbouring buckets stay apart.

#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ddp::tools {

constexpr double kLeftMargin = 140;  // room for "rank N" and the lane labels
constexpr double kRightMargin = 30;  // the last tick label sticks out past the plot's right edge
constexpr double kMinBarWidth = 1;   // px; a 20 us bucket on a 1 s axis is still drawn

struct SvgOptions {
  // Total width in pixels, default 1600: a laptop screen without horizontal scrolling. At least
  // kLeftMargin + kRightMargin + 100.
  double width = 1600;
  // Window in ms from the trace's first event; unset: from 0, to the end of the last event.
  std::optional<double> from_ms;
  std::optional<double> to_ms;
  // Heading of the picture; main() puts the input file's name here.
  std::string title = "Chrome trace timeline";
};

// What is wrong with the trace itself (no events, a malformed event); main() names the file.
struct TraceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `trace` is {"traceEvents": [...], ...} or a bare array of events. Complete events ("ph": "X")
// become bars; "process_name" metadata ("ph": "M") names the rank rows; other phases are ignored.
// Throws TraceError when there is no complete event or one lacks a numeric ts/dur/pid, and
// std::invalid_argument for options that describe no picture (empty window, too narrow).
std::string render_timeline_svg(const nlohmann::json& trace, const SvgOptions& options);

}  // namespace ddp::tools
