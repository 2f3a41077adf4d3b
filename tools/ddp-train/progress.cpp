#include "progress.hpp"

#include <algorithm>

namespace ddp::tools {
namespace {

// "812", "25.3k", "1.20M": short enough for the bar.
std::string short_count(double n) {
  char buf[32];
  if (n >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  } else if (n >= 1e4) {
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", n);
  }
  return buf;
}

}  // namespace

Progress::Progress(int total_steps, bool tty, int every)
    : total_(std::max(total_steps, 1)), tty_(tty), every_(std::max(every, 1)) {}

void Progress::update(int step, double loss, double steps_per_second) {
  const std::string tokens = tokens_per_step_ > 0
                                 ? short_count(double(tokens_per_step_) * steps_per_second)
                                 : std::string();
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = kWidth * step / total_;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stdout, "\r[%s] step %d/%d  loss %.5f  %.1f steps/s%s%s ", bar.c_str(), step,
                 total_, loss, steps_per_second, tokens.empty() ? "" : "  ",
                 tokens.empty() ? "" : (tokens + " tok/s").c_str());
    std::fflush(stdout);
    dirty_ = true;
  } else if (step % every_ == 0 || step == total_ || step == 1) {
    std::fprintf(stdout, "step %d/%d loss %.5f steps/s %.1f%s%s\n", step, total_, loss,
                 steps_per_second, tokens.empty() ? "" : " tok/s ", tokens.c_str());
    std::fflush(stdout);
  }
}

void Progress::note(const std::string& line) {
  if (dirty_) std::fputc('\n', stdout);
  dirty_ = false;
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (dirty_) std::fputc('\n', stdout);
  dirty_ = false;
  std::fflush(stdout);
}

}  // namespace ddp::tools
