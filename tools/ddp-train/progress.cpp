#include "progress.hpp"

#include "common/json_stdout.hpp"

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

// `  key value` for a measured value, "" for NaN.
std::string field(const char* key, double value, const char* format) {
  if (std::isnan(value)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return std::string(" ") + key + " " + buf;
}

// `,"key":value` for a measured value, "" for NaN (JSON has no NaN).
std::string json_field(const char* key, double value) {
  if (!std::isfinite(value)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, ",\"%s\":%.9g", key, value);
  return buf;
}

}  // namespace

Progress::Progress(int total_steps, bool tty, int every, bool json)
    : total_(std::max(total_steps, 1)),
      tty_(tty && !json),
      every_(std::max(every, 1)),
      json_(json) {}

double Progress::mfu(double steps_per_second) const {
  if (!(flops_per_token_ > 0 && peak_flops_ > 0 && tokens_per_step_ > 0)) return NAN;
  return flops_per_token_ * double(tokens_per_step_) * steps_per_second /
         (peak_flops_ * std::max(devices_, 1));
}

void Progress::update(const StepReport& r) {
  const double tok_s = tokens_per_step_ > 0 ? double(tokens_per_step_) * r.steps_per_second : NAN;
  const double mfu_now = mfu(r.steps_per_second);
  if (json_) {
    char head[64];
    std::snprintf(head, sizeof head, "{\"step\":%d,\"loss\":%.9g", r.step, r.loss);
    print_json_line(head + json_field("lr", r.lr) + json_field("grad_norm", r.grad_norm) +
                    json_field("steps_per_s", r.steps_per_second) + json_field("tok_per_s", tok_s) +
                    json_field("mfu", mfu_now) + "}");
    return;
  }
  const std::string tokens = std::isnan(tok_s) ? std::string() : " tok/s " + short_count(tok_s);
  const std::string extra = field("lr", r.lr, "%.3g") + field("norm", r.grad_norm, "%.3f") +
                            tokens + field("mfu", mfu_now * 100, "%.1f%%");
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = kWidth * r.step / total_;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    if (!std::isnan(r.steps_per_second)) shown_rate_ = r.steps_per_second;
    std::fprintf(stdout, "\r[%s] step %d/%d  loss %.5f  %.1f steps/s%s ", bar.c_str(), r.step,
                 total_, r.loss, shown_rate_, extra.c_str());
    std::fflush(stdout);
    dirty_ = true;
  } else if (r.step % every_ == 0 || r.step == total_ || r.step == 1) {
    std::fprintf(stdout, "step %d/%d loss %.5f%s%s\n", r.step, total_, r.loss,
                 field("steps/s", r.steps_per_second, "%.1f").c_str(), extra.c_str());
    std::fflush(stdout);
  }
}

void Progress::note(const std::string& line, const std::string& json) {
  if (json_) {
    if (!json.empty()) print_json_line(json);
    return;
  }
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

double peak_flops_of(const std::string& name) {
  // Dense bf16 tensor-core peaks (no sparsity), SXM parts where there are several.
  static const std::pair<const char*, double> kPeaks[] = {
      {"H200", 989e12}, {"H100", 989e12}, {"GH200", 989e12}, {"A100", 312e12},
      {"L40S", 362e12}, {"L4", 121e12},   {"A10", 125e12},   {"V100", 125e12},
  };
  for (const auto& [part, peak] : kPeaks) {
    if (name.find(part) != std::string::npos) return peak;
  }
  return 0;
}

}  // namespace ddp::tools
