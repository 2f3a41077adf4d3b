#include "step_log.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ddp/optim/grad_clip.hpp"

namespace ddp::tools {

StepLog::StepLog(comm::ProcessGroupPtr group, c10::Device device, Progress& progress, bool lead,
                 int first_step, int last_step)
    : losses_(std::move(group), device, kEvery),
      progress_(progress),
      lead_(lead),
      first_step_(first_step),
      last_step_(last_step),
      start_(std::chrono::steady_clock::now()) {}

StepLog::Pause::~Pause() {
  log_.not_training_s_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double StepLog::training_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() -
         not_training_s_;
}

void StepLog::record(int step, const at::Tensor& loss, std::optional<double> lr,
                     optim::GradClipper* clipper) {
  if (clipper != nullptr) grad_norms_[step] = clipper->norm().clone();
  if (lr) {
    lrs_[step] = *lr;
    curve_.lr.push_back({step, *lr});
  }
  losses_.record(step, loss);
}

void StepLog::flush_if_due(int step, bool needed, double lr, optim::GradClipper* clipper) {
  if (!(step == first_step_ || step % kEvery == 0 || step == last_step_ || needed ||
        losses_.full())) {
    return;
  }
  const double secs = training_seconds();
  // The clip's device counters, read here only: a non-finite step (already dropped on the device)
  // ends the run under the error policy, naming it, or is logged under skip.
  if (clipper != nullptr) clipper->check();
  for (const auto& [at, value] : losses_.flush()) {
    TORCH_CHECK(std::isfinite(value), "the loss became ", value, " at step ", at,
                " (learning rate ", lr, "); lower --lr");
    last_loss_ = value;
    if (at == first_step_) first_loss_ = value;
    if (lead_) {
      StepReport report;
      report.step = at;
      report.loss = value;
      // Measured at this flush, so true of `step` alone: the earlier steps flushed with it have
      // none (a rate repeated over them would be stale).
      report.steps_per_second = at == step ? (step - first_step_ + 1) / secs : NAN;
      if (lrs_.count(at) > 0) report.lr = lrs_[at];
      if (grad_norms_.count(at) > 0) report.grad_norm = grad_norms_[at].item<double>();
      progress_.update(report);
    }
    lrs_.erase(at);
    grad_norms_.erase(at);
    curve_.train.push_back({at, value});
  }
  // After the flush, which waited for the step's loss: the first step's device work included.
  if (step == first_step_) first_step_s_ = training_seconds();
}

std::string StepLog::summary(bool evaluated) const {
  const double secs = training_seconds();
  const int ran = std::max(0, last_step_ - first_step_ + 1);
  std::ostringstream out;
  out << "loss " << first_loss_ << " -> " << last_loss_ << " in " << ran << " steps (" << secs
      << " s, " << ran / secs << " steps/s";
  if (evaluated) out << "; " << not_training_s_ << " s of evaluation and sampling not counted";
  if (ran > 1 && first_step_s_ >= 0 && secs > first_step_s_) {
    out << "; " << (ran - 1) / (secs - first_step_s_) << " steps/s after the first step";
  }
  out << ")";
  return out.str();
}

}  // namespace ddp::tools
