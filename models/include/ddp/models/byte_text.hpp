#pragma once
// Any file as a byte-level language-modelling task (ddp-train --data): the tokens are the file's
// bytes (vocabulary 256), the first 90% of them are for training and the last 10% for validation,
// and a sample is a window of seq_len + 1 consecutive bytes: x is its first seq_len bytes, y the
// same bytes shifted by one (the next byte after each position).
//
//   bytes     [0 ...................................... split) [split ........... size)
//             training: window starts 0 .. split - seq_len - 1  validation: fixed windows
//
// Training windows overlap (every start is a sample, so a sampler's index is a start). The
// validation windows are a fixed set, the same in every run: as many non-overlapping windows as
// the validation part holds, at most kMaxValidationWindows, spread evenly from its first byte to
// its last.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace ddp::models {

class ByteText {
 public:
  // Training takes the first floor(size * 9 / 10) bytes; the validation part, the rest, is
  // ceil(size / 10) bytes.
  static constexpr int64_t kTrainTenths = 9;
  // 256: enough positions for a validation loss steady to ~1% on text, cheap next to a step.
  static constexpr int64_t kMaxValidationWindows = 256;

  // Reads the whole file. Throws c10::Error naming the file and the problem: it cannot be read
  // (errno's text), it is empty, it is shorter than one window (seq_len + 1 bytes), or its
  // validation part is (the message then gives the smallest size that works,
  // min_file_size(seq_len)).
  ByteText(const std::string& path, int64_t seq_len);

  // The smallest file whose validation part holds one window: 10 * seq_len + 1 bytes.
  static int64_t min_file_size(int64_t seq_len);

  const std::string& path() const { return path_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t size() const { return int64_t(bytes_.size()); }
  std::string_view train_text() const { return std::string_view(bytes_).substr(0, split_); }
  std::string_view validation_text() const { return std::string_view(bytes_).substr(split_); }

  // Training samples: window starts 0 .. train_windows() - 1.
  int64_t train_windows() const { return split_ - seq_len_; }
  // x, y: int64 [starts.size(), seq_len] on the CPU; each start < train_windows().
  std::pair<torch::Tensor, torch::Tensor> train_batch(const std::vector<int64_t>& starts) const;

  // The fixed validation windows, numbered 0 .. validation_windows() - 1.
  int64_t validation_windows() const { return int64_t(validation_starts_.size()); }
  // x, y of validation windows [first, first + n).
  std::pair<torch::Tensor, torch::Tensor> validation_batch(int64_t first, int64_t n) const;

  // The entropy of the training part's byte histogram, in nats per byte: the loss of the best
  // model that ignores context, which a language model must beat.
  double unigram_entropy() const;

 private:
  std::pair<torch::Tensor, torch::Tensor> windows(const std::vector<int64_t>& offsets) const;

  std::string path_;
  int64_t seq_len_;
  std::string bytes_;                       // the whole file
  int64_t split_ = 0;                       // first validation byte
  std::vector<int64_t> validation_starts_;  // offsets into bytes_, each >= split_
};

}  // namespace ddp::models
