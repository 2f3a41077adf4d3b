#pragma once
// ddp-train --plot FILE.svg: training and validation loss against steps, drawn with the SVG
// pieces trace-svg uses (common/svg.hpp). Torch-free: it draws numbers.
//
// Layout (SVG pixels):
//
//   title                                                 (common/svg.hpp heading)
//   subtitle
//   loss  6 |‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾|   plot area [kPlotLeft, width - kPlotRight]
//         4 |\__                                      |   x [kPlotTop, height - kPlotBottom]
//         2 |   ‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾|   y ticks: 1/2/5 x 10^k, gridlines
//         0 |_________________________________________|
//           0        100        200       300 step       x ticks
//   [■ training loss] [■ validation loss] [■ reference]   legend
//
// Scales: x runs from 0 to the last step; y from 0 to the first y tick at or above the highest
// loss (or reference) drawn. Each series is one <polyline class="SERIES"> with one "x,y" point per
// logged step, in step order; validation points also get a <circle> each. With a learning rate,
// a right-hand axis (0 to its first tick at or above the highest rate) and a dashed
// <polyline class="lr">.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::tools {

struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

struct LossCurve {
  std::vector<LossPoint> train;       // the mean training loss over ranks, one per step
  std::vector<LossPoint> validation;  // one per evaluation
  // The learning rate per step (LossPoint::loss holds the rate): drawn against a right-hand axis
  // from 0 to its largest value, so a warmup and a decay show beside the loss they shape. Empty:
  // no axis, no line.
  std::vector<LossPoint> lr;
};

// A horizontal dashed line across the plot, e.g. the text's unigram entropy.
struct ReferenceLine {
  double value = 0;
  std::string label;
};

struct LossPlotOptions {
  // 900 x 480: readable in a README column without scaling the text down much.
  double width = 900;
  double height = 480;
  std::string title = "ddp-train: loss";
  std::string subtitle;
  std::string train_label = "training loss";
  std::string validation_label = "validation loss";
  std::string y_label = "loss";
  std::vector<ReferenceLine> references;
};

// The SVG document. Throws std::invalid_argument when there is no training point or the size
// leaves no room for the plot.
std::string render_loss_svg(const LossCurve& curve, const LossPlotOptions& options);

}  // namespace ddp::tools
