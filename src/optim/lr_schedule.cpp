#include "ddp/optim/lr_schedule.hpp"

#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

namespace ddp::optim {

std::string schedule_error(const LrScheduleOptions& o, const LrScheduleNames& n) {
  std::ostringstream out;
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    out << n.lr << " must be a positive number, got " << o.lr;
  } else if (!(o.min_lr >= 0) || o.min_lr > o.lr) {
    out << n.min_lr << " must be between 0 and " << n.lr << " (" << o.lr << "), got " << o.min_lr;
  } else if (o.warmup_steps < 0 || o.decay_steps < 0) {
    out << n.warmup_steps << " and " << n.decay_steps << " must be >= 0, got " << o.warmup_steps
        << " and " << o.decay_steps;
  } else if (o.decay != LrDecay::kConstant && o.decay_steps == 0) {
    out << "a " << decay_name(o.decay) << " decay needs " << n.decay_steps
        << " (the step at which it reaches " << n.min_lr << ")";
  } else if (o.decay != LrDecay::kConstant && o.warmup_steps > o.decay_steps) {
    out << n.warmup_steps << " (" << o.warmup_steps << ") must not exceed " << n.decay_steps << " ("
        << o.decay_steps << "): the decay would end before the warmup";
  }
  return out.str();
}

double lr_at(const LrScheduleOptions& o, int64_t step) {
  const std::string wrong = schedule_error(o);
  TORCH_CHECK(wrong.empty(), "ddp: ", wrong);
  TORCH_CHECK(step >= 0, "ddp: lr_at: step ", step, " is negative");
  if (step < o.warmup_steps) {
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps + 1);
  }
  if (o.decay == LrDecay::kConstant) return o.lr;
  if (step > o.decay_steps) return o.min_lr;
  // decay_steps == warmup_steps: the decay is a step down at the warmup's end.
  const double span = static_cast<double>(o.decay_steps - o.warmup_steps);
  const double r = span > 0 ? static_cast<double>(step - o.warmup_steps) / span : 1.0;
  const double coeff = o.decay == LrDecay::kLinear ? 1.0 - r : 0.5 * (1.0 + std::cos(M_PI * r));
  return o.min_lr + coeff * (o.lr - o.min_lr);
}

const char* decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::kConstant:
      return "constant";
    case LrDecay::kLinear:
      return "linear";
    case LrDecay::kCosine:
      return "cosine";
  }
  return "?";
}

LrDecay decay_from_name(const std::string& name) {
  for (LrDecay d : {LrDecay::kConstant, LrDecay::kLinear, LrDecay::kCosine}) {
    if (name == decay_name(d)) return d;
  }
  TORCH_CHECK(false, "ddp: unknown learning-rate decay '", name,
              "'; valid: constant, linear, cosine");
}

std::vector<std::pair<std::string, std::string>> describe(const LrScheduleOptions& o) {
  const auto number = [](double v) {
    std::ostringstream out;
    out << v;
    return out.str();
  };
  return {{"lr", number(o.lr)},
          {"min_lr", number(o.min_lr)},
          {"warmup_steps", std::to_string(o.warmup_steps)},
          {"decay_steps", std::to_string(o.decay_steps)},
          {"decay", decay_name(o.decay)}};
}

}  // namespace ddp::optim
