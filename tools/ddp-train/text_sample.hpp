#pragma once
// The text sample ddp-train --data prints at the end: bytes a byte-level language model writes
// after a prompt, drawn one at a time with temperature sampling from a generator of a fixed seed,
// so a run prints the same sample every time.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <torch/types.h>

namespace ddp::tools {

struct SampleOptions {
  // 300 bytes: four or five lines of text, enough to judge spelling and layout.
  int64_t bytes = 300;
  // 0.8: a little sharper than the model's distribution; greedy decoding (0) soon repeats one
  // phrase in a small model, and 1 reads as noise early in training.
  double temperature = 0.8;
  // The sampling generator's seed: the run's --seed, so the sample is reproducible.
  uint64_t seed = 1234;
  // The longest context the model takes (its seq_len); the prompt and the bytes drawn so far are
  // cut to their last `context` bytes.
  int64_t context = 64;
  // The device the model is on; the token ids go there.
  torch::Device device = torch::kCPU;
};

// Logits [1, T, V >= 256] for token ids [1, T] (int64, on options.device).
using TokenForward = std::function<torch::Tensor(const torch::Tensor&)>;

// `options.bytes` bytes drawn after `prompt` (not included), each from softmax(logits / T) over
// the 256 byte values. Runs `options.bytes` forwards, the same number on every rank: collective
// when the forward is (sharded styles, tensor parallelism).
std::string sample_text(const TokenForward& forward, const std::string& prompt,
                        const SampleOptions& options);

// `bytes` for a terminal: printable ASCII, newline and tab as they are, a backslash as "\\",
// every other byte as "\xNN".
std::string printable(std::string_view bytes);

}  // namespace ddp::tools
