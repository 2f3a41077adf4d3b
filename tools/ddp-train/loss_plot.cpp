#include "loss_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "common/svg.hpp"

namespace ddp::tools {
namespace {

// Room for the y tick labels and the rotated y label on the left, the heading on top, the x tick
// labels, the x label and the legend below.
constexpr double kPlotLeft = 78;
constexpr double kPlotRight = 30;
constexpr double kPlotTop = 66;
constexpr double kPlotBottom = 84;

// Tableau 10's blue and orange (trace-svg's forward colour and its neighbour): apart at a glance
// for the common colour-vision deficiencies.
constexpr const char* kTrainColour = "#4e79a7";
constexpr const char* kValidationColour = "#f28e2b";
constexpr const char* kReferenceColour = "#7f7f7f";
constexpr const char* kLrColour = "#59a14f";  // Tableau 10's green
// Dashed series, drawn so in the legend too: the rate and the reference lines.
constexpr const char* kLrDash = "4 3";
constexpr const char* kReferenceDash = "6 4";
// With a learning rate: room for its tick labels and its rotated label on the right.
constexpr double kPlotRightWithLr = 78;

// A learning rate as a tick label: "6e-04" reads worse than "0.0006", "0.0006" better than
// "0.000600"; %g picks the short form.
std::string rate_label(double v) {
  if (std::fabs(v) < 1e-300) return "0";  // never "-0"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string render_loss_svg(const LossCurve& curve, const LossPlotOptions& options) {
  using svg::number;
  if (curve.train.empty()) throw std::invalid_argument("no training loss to plot");
  const bool with_lr = !curve.lr.empty();
  const double right = with_lr ? kPlotRightWithLr : kPlotRight;
  const double plot_w = options.width - kPlotLeft - right;
  const double plot_h = options.height - kPlotTop - kPlotBottom;
  if (!(plot_w >= 100 && plot_h >= 100)) {
    throw std::invalid_argument("a " + number(options.width, 0) + " x " +
                                number(options.height, 0) +
                                " px picture leaves no room for the plot");
  }

  int64_t last_step = 1;
  double top = 0;
  for (const auto* series : {&curve.train, &curve.validation}) {
    for (const LossPoint& p : *series) {
      last_step = std::max(last_step, p.step);
      if (std::isfinite(p.loss)) top = std::max(top, p.loss);
    }
  }
  double lr_top = 0;
  for (const LossPoint& p : curve.lr) {
    last_step = std::max(last_step, p.step);
    if (std::isfinite(p.loss)) lr_top = std::max(lr_top, p.loss);
  }
  if (!(lr_top > 0)) lr_top = 1;
  for (const ReferenceLine& r : options.references) top = std::max(top, r.value);
  if (!(top > 0)) top = 1;
  // The y axis ends on a tick: ticks over [0, top], and one more step when the last falls short.
  svg::Ticks y_ticks = svg::ticks(0, top, plot_h, 45);
  if (y_ticks.values.back() < top - 1e-12) {
    y_ticks.values.push_back(y_ticks.values.back() + y_ticks.step);
  }
  const double y_max = y_ticks.values.back();
  svg::Ticks lr_ticks = svg::ticks(0, lr_top, plot_h, 45);
  if (lr_ticks.values.back() < lr_top * (1 - 1e-9)) {
    lr_ticks.values.push_back(lr_ticks.values.back() + lr_ticks.step);
  }
  const double lr_max = lr_ticks.values.back();
  const svg::Ticks x_ticks = svg::ticks(0, double(last_step), plot_w);

  const double bottom = kPlotTop + plot_h;
  const auto x_of = [&](double step) { return kPlotLeft + step / double(last_step) * plot_w; };
  const auto y_of = [&](double loss) {
    return bottom - std::clamp(loss, 0.0, y_max) / y_max * plot_h;
  };
  const auto y_of_lr = [&](double lr) {
    return bottom - std::clamp(lr, 0.0, lr_max) / lr_max * plot_h;
  };

  // The legend first: the picture grows to hold all its rows (they touched the bottom edge).
  std::vector<svg::LegendEntry> legend = {{options.train_label, kTrainColour, ""}};
  if (!curve.validation.empty()) {
    legend.push_back({options.validation_label, kValidationColour, ""});
  }
  if (with_lr) legend.push_back({"learning rate", kLrColour, kLrDash});
  for (const ReferenceLine& r : options.references) {
    legend.push_back({r.label, kReferenceColour, kReferenceDash});
  }
  const svg::LegendLayout layout =
      svg::layout_legend(legend, legend.size(), kPlotLeft, bottom + 50, options.width - right);
  const double height = std::max(options.height, layout.bottom + 16);

  std::ostringstream s;
  s << svg::open(options.width, height);
  s << svg::title(options.title);
  if (!options.subtitle.empty()) s << svg::subtitle(options.subtitle);

  s << "<g id=\"grid\" font-size=\"11\" fill=\"#444444\">\n";
  s << "<rect x=\"" << number(kPlotLeft) << "\" y=\"" << number(kPlotTop) << "\" width=\""
    << number(plot_w) << "\" height=\"" << number(plot_h) << "\" fill=\"#f7f8fa\"/>\n";
  for (const double v : y_ticks.values) {
    const double y = y_of(v);
    s << svg::line(kPlotLeft - 4, y, kPlotLeft + plot_w, y, "#c8ccd2", 0.7);
    s << "<text x=\"" << number(kPlotLeft - 8) << "\" y=\"" << number(y + 4)
      << "\" text-anchor=\"end\">" << number(v, y_ticks.decimals) << "</text>\n";
  }
  for (const double v : x_ticks.values) {
    const double x = x_of(v);
    s << svg::line(x, kPlotTop, x, bottom + 4, "#c8ccd2", 0.7);
    s << "<text x=\"" << number(x) << "\" y=\"" << number(bottom + 18)
      << "\" text-anchor=\"middle\">" << number(v, x_ticks.decimals) << "</text>\n";
  }
  s << svg::line(kPlotLeft, bottom, kPlotLeft + plot_w, bottom, "#888888");
  s << svg::line(kPlotLeft, kPlotTop, kPlotLeft, bottom, "#888888");
  s << "<text x=\"" << number(kPlotLeft + plot_w / 2) << "\" y=\"" << number(bottom + 36)
    << "\" font-size=\"12\" text-anchor=\"middle\">step</text>\n";
  const double label_y = kPlotTop + plot_h / 2;
  s << "<text x=\"18\" y=\"" << number(label_y) << "\" font-size=\"12\" text-anchor=\"middle\" "
    << "transform=\"rotate(-90 18 " << number(label_y) << ")\">" << svg::escape(options.y_label)
    << "</text>\n";
  if (with_lr) {
    const double axis = kPlotLeft + plot_w;
    s << svg::line(axis, kPlotTop, axis, bottom, kLrColour);
    for (const double v : lr_ticks.values) {
      s << "<text x=\"" << number(axis + 6) << "\" y=\"" << number(y_of_lr(v) + 4) << "\" fill=\""
        << kLrColour << "\">" << rate_label(v) << "</text>\n";
    }
    const double lr_label_x = options.width - 14;
    s << "<text x=\"" << number(lr_label_x) << "\" y=\"" << number(label_y)
      << "\" font-size=\"12\" text-anchor=\"middle\" fill=\"" << kLrColour
      << "\" transform=\"rotate(90 " << number(lr_label_x) << " " << number(label_y)
      << ")\">learning rate</text>\n";
  }
  s << "</g>\n";

  s << "<g id=\"references\">\n";
  for (const ReferenceLine& r : options.references) {
    s << "<line x1=\"" << number(kPlotLeft) << "\" y1=\"" << number(y_of(r.value)) << "\" x2=\""
      << number(kPlotLeft + plot_w) << "\" y2=\"" << number(y_of(r.value)) << "\" stroke=\""
      << kReferenceColour << "\" stroke-width=\"1.2\" stroke-dasharray=\"" << kReferenceDash
      << "\"><title>" << svg::escape(r.label) << ": " << number(r.value, 4) << "</title></line>\n";
  }
  s << "</g>\n";

  const auto polyline = [&](const std::vector<LossPoint>& points, const char* cls,
                            const char* colour, double width) {
    s << "<polyline class=\"" << cls << "\" fill=\"none\" stroke=\"" << colour
      << "\" stroke-width=\"" << width << "\" stroke-linejoin=\"round\" points=\"";
    for (size_t i = 0; i < points.size(); ++i) {
      s << (i ? " " : "") << number(x_of(double(points[i].step))) << ','
        << number(y_of(points[i].loss));
    }
    s << "\"/>\n";
  };
  s << "<g id=\"series\">\n";
  polyline(curve.train, "train", kTrainColour, 1.2);
  if (!curve.validation.empty()) {
    polyline(curve.validation, "validation", kValidationColour, 2);
    for (const LossPoint& p : curve.validation) {
      s << "<circle cx=\"" << number(x_of(double(p.step))) << "\" cy=\"" << number(y_of(p.loss))
        << "\" r=\"3\" fill=\"" << kValidationColour << "\"><title>step " << p.step
        << ": validation loss " << number(p.loss, 4) << "</title></circle>\n";
    }
  }
  if (with_lr) {
    s << "<polyline class=\"lr\" fill=\"none\" stroke=\"" << kLrColour
      << "\" stroke-width=\"1.2\" stroke-dasharray=\"" << kLrDash << "\" points=\"";
    for (size_t i = 0; i < curve.lr.size(); ++i) {
      s << (i ? " " : "") << number(x_of(double(curve.lr[i].step))) << ','
        << number(y_of_lr(curve.lr[i].loss));
    }
    s << "\"/>\n";
  }
  s << "</g>\n";

  s << "<g id=\"legend\" font-size=\"12\" fill=\"#1f1f1f\">\n";
  s << svg::legend_items(legend, layout);
  s << "</g>\n";
  s << svg::close();
  return s.str();
}

}  // namespace ddp::tools
