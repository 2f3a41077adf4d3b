#pragma once
// Training progress for a person: a redrawn bar on a terminal, plain lines in a log.

#include <cstdio>
#include <string>

namespace ddp::tools {

class Progress {
 public:
  // `tty`: redraw one line with \r; otherwise print a line every `every` steps.
  Progress(int total_steps, bool tty, int every);
  void update(int step, double loss, double steps_per_second);
  void finish();

 private:
  int total_;
  bool tty_;
  int every_;
  bool dirty_ = false;  // a bar is on screen without a newline
};

}  // namespace ddp::tools
