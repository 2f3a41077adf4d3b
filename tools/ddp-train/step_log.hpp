#pragma once
// What ddp-train keeps of its steps for people: each step's loss on the device until a progress
// line, an evaluation, a checkpoint or the end needs it (loss_log.hpp), the rate and gradient norm
// of the steps not printed yet, the curve for --plot, and the training time without evaluation
// and sampling. Every rank keeps one: a flush is collective (the mean loss over the ranks).

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "loss_log.hpp"
#include "loss_plot.hpp"
#include "progress.hpp"

namespace ddp::optim {
class GradClipper;
}

namespace ddp::tools {

class StepLog {
 public:
  // Steps first_step..last_step; `progress` prints on the lead rank (`lead`).
  StepLog(comm::ProcessGroupPtr group, c10::Device device, Progress& progress, bool lead,
          int first_step, int last_step);

  // Step `step`'s loss (a device scalar), its rate (when the run has a schedule) and the clip's
  // norm (when it clips): device copies, no host read.
  void record(int step, const at::Tensor& loss, std::optional<double> lr,
              optim::GradClipper* clipper);
  // Reads the losses when a line is due at `step` (every kEvery steps, the first and the last)
  // or `needed` (an evaluation or a checkpoint reads the loss): collective. A loss that is not
  // finite ends the run naming its step and `lr`; the clip's counters are checked here.
  void flush_if_due(int step, bool needed, double lr, optim::GradClipper* clipper);

  // Time not spent training (evaluation, sampling) from here to the guard's end: left out of
  // every steps/s.
  class Pause {
   public:
    explicit Pause(StepLog& log) : log_(log), start_(std::chrono::steady_clock::now()) {}
    ~Pause();
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    StepLog& log_;
    std::chrono::steady_clock::time_point start_;
  };

  double last_loss() const { return last_loss_; }
  LossCurve& curve() { return curve_; }
  const LossCurve& curve() const { return curve_; }
  // The last line: "loss A -> B in N steps (S s, R steps/s; ...)".
  std::string summary(bool evaluated) const;

 private:
  double training_seconds() const;

  // The progress lines' interval: a log prints every 20 steps.
  static constexpr int kEvery = 20;
  LossLog losses_;
  Progress& progress_;
  bool lead_;
  int first_step_, last_step_;
  // The rate and the norm of the recorded steps not flushed yet: a line shows all three.
  std::map<int64_t, double> lrs_;
  std::map<int64_t, at::Tensor> grad_norms_;  // device copies
  LossCurve curve_;
  std::chrono::steady_clock::time_point start_;
  // Seconds evaluating and sampling: a captured step made them most of a run's time (its steps
  // are a few ms, a validation pass and a sample are eager forwards).
  double not_training_s_ = 0;
  // Training seconds when the first step's loss was read: that step also pays the process's
  // one-time CUDA and library start (0.8 s on an H100, most of a short captured run). -1: not yet.
  double first_step_s_ = -1;
  double first_loss_ = 0, last_loss_ = 0;
};

}  // namespace ddp::tools
