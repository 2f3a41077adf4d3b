#pragma once
// Runs a shell command for tool tests: its stdout+stderr and exit status.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace ddp::testing {

inline std::pair<std::string, int> run_command(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {"popen failed", -1};
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  const int status = ::pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// The two numbers of ddp-train's summary line "ddp-train: loss <first> -> <last>", or nothing
// when the output has none.
inline std::optional<std::pair<double, double>> train_losses(const std::string& out) {
  const auto pos = out.find("ddp-train: loss ");
  double first = 0, last = 0;
  if (pos == std::string::npos ||
      std::sscanf(out.c_str() + pos, "ddp-train: loss %lf -> %lf", &first, &last) != 2) {
    return std::nullopt;
  }
  return std::make_pair(first, last);
}

// Writes `text` to `path`, replacing what was there.
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ddp::testing
