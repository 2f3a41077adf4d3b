#pragma once
// Training progress for a person: a redrawn bar on a terminal, plain lines in a log, or with
// --json one JSON object per logged step for plotting.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ddp::tools {

// One logged step. NaN: not measured (no schedule or clip in this run).
struct StepReport {
  int step = 0;
  double loss = 0;
  // Measured at the flush of this step; NaN for the steps flushed before it in the same read.
  double steps_per_second = NAN;
  double lr = NAN;
  double grad_norm = NAN;  // before clipping (--grad-clip)
};

class Progress {
 public:
  // `tty`: redraw one line with \r; otherwise print a line every `every` steps. `json`: one
  // object per update instead (every update, not every `every`).
  Progress(int total_steps, bool tty, int every, bool json = false);
  // Tokens the whole run (every rank) trains on per step: updates then show tokens per second
  // too. Default 0: not shown (the synthetic workloads have no tokens).
  void set_tokens_per_step(int64_t tokens) { tokens_per_step_ = tokens; }
  // Model FLOPs utilization (nanoGPT's estimate_mfu): `flops_per_token` (models::Workload) times
  // tokens per second, over `devices` devices of `peak_flops` each. Not shown while either is 0.
  void set_mfu(double flops_per_token, double peak_flops, int devices) {
    flops_per_token_ = flops_per_token;
    peak_flops_ = peak_flops;
    devices_ = devices;
  }
  void update(const StepReport& report);
  // A line of its own between updates (a validation loss, say): a bar on screen is ended first,
  // and the next update draws a new one below the line. `json`: what --json prints instead
  // (nothing when empty).
  void note(const std::string& line, const std::string& json = "");
  void finish();
  // The MFU of a step at `steps_per_second`, a fraction; NaN when not known.
  double mfu(double steps_per_second) const;

 private:
  int total_;
  bool tty_;
  int every_;
  bool json_;
  int64_t tokens_per_step_ = 0;
  double flops_per_token_ = 0;
  double peak_flops_ = 0;
  int devices_ = 1;
  bool dirty_ = false;     // a bar is on screen without a newline
  double shown_rate_ = 0;  // the bar's rate: the last one measured
};

// The peak dense bf16 tensor FLOP/s of a GPU by its name (the vendors' data sheets: H100 and H200
// SXM 989e12, A100 312e12, ...); 0 for one not in the table (then --peak-tflops says it).
double peak_flops_of(const std::string& device_name);

}  // namespace ddp::tools
