#pragma once
// The tools' command-line parse: CLI11's, with an unknown flag answered by the known flag nearest
// to it (issue 46: "The following arguments were not expected: 10 --stpes" suggested nothing).
//
//   if (const int code = ddp::tools::parse_flags(app, argc, argv, "ddp-train"); code >= 0)
//     return code;

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ddp::tools {

// While alive, the options added to `app` are listed under `name` in --help (each of the tools'
// flag sets takes one: the help was one flat list of ~80 options). An option may still name its
// own group ("" hides it).
class FlagGroup {
 public:
  FlagGroup(CLI::App& app, const std::string& name)
      : app_(app), saved_(app.option_defaults()->get_group()) {
    app_.option_defaults()->group(name);
  }
  ~FlagGroup() { app_.option_defaults()->group(saved_); }
  FlagGroup(const FlagGroup&) = delete;
  FlagGroup& operator=(const FlagGroup&) = delete;

 private:
  CLI::App& app_;
  std::string saved_;
};

// The known long flag (with its "--") within two edits of `given`, the nearest; "" when none.
std::string nearest_flag(const std::string& given, const std::vector<std::string>& known);

// -1 when `argv` parsed; else the exit code, after printing help (0), or the error, one line on
// stderr and 2 for every bad flag or value: for an unknown flag "<tool>: unknown flag --stpes; did
// you mean --steps?", for a word CLI11 cannot place "<tool>: <bare_words>" when given, for a bad
// value CLI11's message ("<tool>: --steps: Value ten not in range 1 to 1000000; see --help").
int parse_flags(CLI::App& app, int argc, char** argv, const std::string& tool,
                const std::string& bare_words = "");

}  // namespace ddp::tools
