// trace-svg: a Chrome trace (ddp-bench --profile) as an SVG timeline, one row per rank.
//
//   trace-svg profile.json -o profile.svg [--width 1600] [--from-ms X --to-ms Y] [--title T]
//
// View it by opening profile.svg in a browser (hover a bar for its name, start and duration).
// The drawing is render_timeline_svg (timeline_svg.hpp, which documents the layout); this file
// only reads and writes. Errors name the file and the problem on stderr and exit with 1.

#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/flag_parse.hpp"
#include "timeline_svg.hpp"

namespace {

int fail(const std::string& message) {
  std::cerr << "trace-svg: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trace-svg: draws a Chrome trace (ddp-bench --profile) as an SVG timeline"};
  std::string input, output;
  ddp::tools::SvgOptions options;
  double from_ms = 0, to_ms = 0;
  app.add_option("input", input, "Chrome trace JSON (ddp-bench --profile writes profile.json)")
      ->required();
  app.add_option("-o,--output", output, "SVG to write; open it in a browser")->required();
  app.add_option("--width", options.width, "picture width in pixels")
      ->capture_default_str()
      ->check(CLI::Range(300.0, 100000.0));
  auto* from_opt =
      app.add_option("--from-ms", from_ms, "window start, ms after the trace's first event");
  auto* to_opt = app.add_option("--to-ms", to_ms, "window end, ms after the trace's first event");
  app.add_option("--title", options.title, "heading (default: the input's file name)");
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "trace-svg"); code >= 0) {
    return code;
  }
  if (*from_opt) options.from_ms = from_ms;
  if (*to_opt) options.to_ms = to_ms;
  if (app.count("--title") == 0) options.title = input;

  std::ifstream in(input);
  if (!in) return fail("cannot open '" + input + "' for reading");
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return fail("'" + input + "' is not valid JSON: " + e.what());
  }

  std::string svg;
  try {
    svg = ddp::tools::render_timeline_svg(trace, options);
  } catch (const ddp::tools::TraceError& e) {
    return fail("'" + input + "': " + e.what());
  } catch (const std::invalid_argument& e) {
    return fail(e.what());  // the options, not the file
  } catch (const std::exception& e) {
    return fail("'" + input + "': " + e.what());
  }

  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << svg;
  out.close();
  if (!out) return fail("cannot write '" + output + "'");
  std::cout << "trace-svg: wrote " << output << "\n";
  return 0;
}
