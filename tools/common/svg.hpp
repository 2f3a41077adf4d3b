#pragma once
// The SVG drawing pieces the tools share: trace-svg's timeline (tools/trace-svg/timeline_svg.hpp)
// and ddp-train's loss curve (tools/ddp-train/loss_plot.hpp) are drawn with these, so both
// pictures have one look: the same page, heading, fonts, number format, tick spacing and legend.
//
// Torch-free on purpose (trace-svg links no libtorch); every function returns SVG text to append
// to the document, coordinates in SVG pixels printed with 3 decimals.
//
//   open(width, height)        <svg ...> and the white page
//   heading(title, subtitle)   title at y = kTitleBaseline, subtitle at y = kSubtitleBaseline
//   ... the picture ...
//   legend(entries, layout)    coloured swatches with their names, flowed left to right
//   close()                    </svg>

#include <cstddef>
#include <string>
#include <vector>

namespace ddp::tools::svg {

constexpr double kTitleBaseline = 28;
constexpr double kSubtitleBaseline = 48;
constexpr double kSwatch = 12;        // legend swatch side (px)
constexpr double kLegendLine = 22;    // legend row pitch (px)
constexpr double kCharWidth12 = 6.9;  // rough width of a 12 px character (no font metrics here)

// `v` with `decimals` decimals; "-0.000" prints as "0.000".
std::string number(double v, int decimals = 3);

// `text` with the five XML special characters as entities.
std::string escape(const std::string& text);

// Axis ticks over [from, to] drawn `length` px long: a step of 1, 2 or 5 times a power of ten
// giving a tick about every `spacing` px (at least 2 intervals), the tick values from the first
// multiple of the step at or after `from` to the last at or before `to`, and the decimals that
// print the step exactly.
struct Ticks {
  double step = 1;
  int decimals = 0;
  std::vector<double> values;
};
Ticks ticks(double from, double to, double length, double spacing = 110);

// <svg> with width, height, viewBox and the font, then the white page (one <rect>).
std::string open(double width, double height);
std::string close();

// The picture's bold 18 px title at (12, kTitleBaseline) and its grey 12 px subtitle below.
// Both are escaped here.
std::string title(const std::string& text);
std::string subtitle(const std::string& text);

// <line> from (x1, y1) to (x2, y2); stroke_width 0 leaves the attribute out (1 px).
std::string line(double x1, double y1, double x2, double y2, const std::string& stroke,
                 double stroke_width = 0);

struct LegendEntry {
  std::string name;
  std::string colour;  // "#rrggbb"
  // The series' stroke-dasharray ("4 3"): its swatch is a dashed line, as the series is drawn;
  // "" (default): a filled square.
  std::string dash;
};

// Where each entry's swatch goes: entries flow left to right from (left, top) and wrap before
// `right`; (end_x, end_y) is where the next entry would go, `bottom` the last row's swatch bottom.
struct LegendLayout {
  struct Place {
    double x, y;
  };
  std::vector<Place> at;
  double end_x = 0, end_y = 0;
  double bottom = 0;
};
LegendLayout layout_legend(const std::vector<LegendEntry>& entries, size_t shown, double left,
                           double top, double right);

// The swatches and names of the first layout.at.size() entries (one <rect> and one <text> each),
// without the enclosing group.
std::string legend_items(const std::vector<LegendEntry>& entries, const LegendLayout& layout);

}  // namespace ddp::tools::svg
