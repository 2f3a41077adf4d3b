#pragma once
// Training progress for a person: a redrawn bar on a terminal, plain lines in a log.

#include <cstdint>
#include <cstdio>
#include <string>

namespace ddp::tools {

class Progress {
 public:
  // `tty`: redraw one line with \r; otherwise print a line every `every` steps.
  Progress(int total_steps, bool tty, int every);
  // Tokens the whole run (every rank) trains on per step: updates then show tokens per second
  // too. Default 0: not shown (the synthetic workloads have no tokens).
  void set_tokens_per_step(int64_t tokens) { tokens_per_step_ = tokens; }
  void update(int step, double loss, double steps_per_second);
  // A line of its own between updates (a validation loss, say): a bar on screen is ended first,
  // and the next update draws a new one below the line.
  void note(const std::string& line);
  void finish();

 private:
  int total_;
  bool tty_;
  int every_;
  int64_t tokens_per_step_ = 0;
  bool dirty_ = false;  // a bar is on screen without a newline
};

}  // namespace ddp::tools
