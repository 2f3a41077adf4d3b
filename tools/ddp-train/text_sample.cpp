#include "text_sample.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>

namespace ddp::tools {

std::string sample_text(const TokenForward& forward, const std::string& prompt,
                        const SampleOptions& options) {
  TORCH_CHECK(!prompt.empty(), "sample_text: the prompt is empty");
  TORCH_CHECK(options.temperature > 0, "sample_text: temperature must be positive, got ",
              options.temperature);
  torch::NoGradGuard no_grad;
  // A generator of its own: sampling neither reads nor moves the global one.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::string text = prompt;
  for (int64_t i = 0; i < options.bytes; ++i) {
    const int64_t t = std::min<int64_t>(options.context, int64_t(text.size()));
    auto ids = torch::empty({1, t}, torch::kLong);
    auto a = ids.accessor<int64_t, 2>();
    for (int64_t j = 0; j < t; ++j) {
      a[0][j] = static_cast<unsigned char>(text[text.size() - size_t(t - j)]);
    }
    const auto logits = forward(ids.to(options.device));
    // A model with a larger vocabulary (gpt-tiny's 4096) is asked about bytes only.
    const auto last =
        logits.select(1, t - 1).select(0, 0).slice(0, 0, 256).to(torch::kCPU, torch::kFloat);
    const auto probs = torch::softmax(last / options.temperature, 0);
    const int64_t next = torch::multinomial(probs, 1, false, generator).item<int64_t>();
    text.push_back(static_cast<char>(next));
  }
  return text.substr(prompt.size());
}

std::string printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n' || c == '\t' || (u >= 0x20 && u < 0x7f)) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

}  // namespace ddp::tools
