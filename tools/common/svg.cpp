#include "svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace ddp::tools::svg {

std::string number(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos)
    s = decimals > 0 ? "0." + std::string(decimals, '0') : "0";
  return s;
}

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Ticks ticks(double from, double to, double length, double spacing) {
  Ticks t;
  const double raw = (to - from) / std::max(2.0, length / spacing);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  t.step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  t.decimals = std::max(0, int(-std::floor(std::log10(t.step) + 1e-9)));
  // The small slack keeps a tick that lands on `from` or `to` up to rounding.
  for (double v = std::ceil(from / t.step - 1e-9) * t.step; v <= to + t.step * 1e-6; v += t.step)
    t.values.push_back(v);
  return t;
}

std::string open(double width, double height) {
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << number(width, 0) << "\" height=\""
    << number(height, 0) << "\" viewBox=\"0 0 " << number(width, 0) << ' ' << number(height, 0)
    << "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  return s.str();
}

std::string close() { return "</svg>\n"; }

std::string title(const std::string& text) {
  std::ostringstream s;
  s << "<text x=\"12\" y=\"" << kTitleBaseline
    << "\" font-size=\"18\" font-weight=\"bold\" fill=\"#1f1f1f\">" << escape(text) << "</text>\n";
  return s.str();
}

std::string subtitle(const std::string& text) {
  std::ostringstream s;
  s << "<text x=\"12\" y=\"" << kSubtitleBaseline << "\" font-size=\"12\" fill=\"#666666\">"
    << escape(text) << "</text>\n";
  return s.str();
}

std::string line(double x1, double y1, double x2, double y2, const std::string& stroke,
                 double stroke_width) {
  std::ostringstream s;
  s << "<line x1=\"" << number(x1) << "\" y1=\"" << number(y1) << "\" x2=\"" << number(x2)
    << "\" y2=\"" << number(y2) << "\" stroke=\"" << stroke << '"';
  if (stroke_width > 0) s << " stroke-width=\"" << stroke_width << '"';
  s << "/>\n";
  return s.str();
}

LegendLayout layout_legend(const std::vector<LegendEntry>& entries, size_t shown, double left,
                           double top, double right) {
  LegendLayout layout;
  double x = left, y = top;
  for (size_t i = 0; i < std::min(shown, entries.size()); ++i) {
    const double item = kSwatch + 6 + double(entries[i].name.size()) * kCharWidth12 + 18;
    if (x > left && x + item > right) {
      x = left;
      y += kLegendLine;
    }
    layout.at.push_back({x, y});
    x += item;
  }
  layout.end_x = x;
  layout.end_y = y;
  layout.bottom = y + kSwatch;
  return layout;
}

std::string legend_items(const std::vector<LegendEntry>& entries, const LegendLayout& layout) {
  std::ostringstream s;
  for (size_t i = 0; i < layout.at.size() && i < entries.size(); ++i) {
    const auto [x, y] = layout.at[i];
    if (entries[i].dash.empty()) {
      s << "<rect x=\"" << number(x) << "\" y=\"" << number(y) << "\" width=\"" << number(kSwatch)
        << "\" height=\"" << number(kSwatch) << "\" fill=\"" << entries[i].colour << "\"/>\n";
    } else {
      s << "<line x1=\"" << number(x) << "\" y1=\"" << number(y + kSwatch / 2) << "\" x2=\""
        << number(x + kSwatch) << "\" y2=\"" << number(y + kSwatch / 2) << "\" stroke=\""
        << entries[i].colour << "\" stroke-width=\"2\" stroke-dasharray=\"" << entries[i].dash
        << "\"/>\n";
    }
    s << "<text x=\"" << number(x + kSwatch + 6) << "\" y=\"" << number(y + kSwatch - 1) << "\">"
      << escape(entries[i].name) << "</text>\n";
  }
  return s.str();
}

}  // namespace ddp::tools::svg
