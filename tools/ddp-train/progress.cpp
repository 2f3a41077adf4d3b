#include "progress.hpp"

#include <algorithm>

namespace ddp::tools {

Progress::Progress(int total_steps, bool tty, int every)
    : total_(std::max(total_steps, 1)), tty_(tty), every_(std::max(every, 1)) {}

void Progress::update(int step, double loss, double steps_per_second) {
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = kWidth * step / total_;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stdout, "\r[%s] step %d/%d  loss %.5f  %.1f steps/s ", bar.c_str(), step, total_,
                 loss, steps_per_second);
    std::fflush(stdout);
    dirty_ = true;
  } else if (step % every_ == 0 || step == total_ || step == 1) {
    std::fprintf(stdout, "step %d/%d loss %.5f steps/s %.1f\n", step, total_, loss,
                 steps_per_second);
    std::fflush(stdout);
  }
}

void Progress::finish() {
  if (dirty_) std::fputc('\n', stdout);
  dirty_ = false;
  std::fflush(stdout);
}

}  // namespace ddp::tools
