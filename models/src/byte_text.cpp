#include "ddp/models/byte_text.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <c10/util/Exception.h>

namespace ddp::models {
namespace {

// The whole file, or the errno of the call that failed.
int read_all(const std::string& path, std::string& out) {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                             &std::fclose);
  if (!file) return errno;
  std::array<char, 1 << 16> buf{};
  for (;;) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), file.get());
    out.append(buf.data(), n);
    if (n < buf.size()) break;
  }
  // A directory opens but fails to read (EISDIR).
  return std::ferror(file.get()) ? (errno != 0 ? errno : EIO) : 0;
}

}  // namespace

int64_t ByteText::min_file_size(int64_t seq_len) {
  // The validation part is ceil(size / 10) bytes: at least seq_len + 1 from 10 * seq_len + 1 on.
  return 10 * seq_len + 1;
}

ByteText::ByteText(const std::string& path, int64_t seq_len) : path_(path), seq_len_(seq_len) {
  TORCH_CHECK(seq_len > 0, "ByteText: seq_len must be positive, got ", seq_len);
  errno = 0;
  if (const int error = read_all(path, bytes_); error != 0) {
    TORCH_CHECK(false, "cannot read the text file '", path, "': ", std::strerror(error));
  }
  const int64_t window = seq_len + 1;
  TORCH_CHECK(!bytes_.empty(), "the text file '", path, "' is empty: there is nothing to train on");
  TORCH_CHECK(size() >= window, "the text file '", path, "' has ", size(),
              " bytes, shorter than one sequence: a sample is seq_len + 1 = ", window, " bytes (",
              seq_len, " inputs and the byte after them)");
  split_ = size() * kTrainTenths / 10;
  TORCH_CHECK(size() - split_ >= window, "the text file '", path, "' has ", size(),
              " bytes: its validation part (the last 10%, ", size() - split_,
              " bytes) is shorter than one sequence of ", window, " bytes; a file of at least ",
              min_file_size(seq_len), " bytes is needed");

  // As many as fit without overlapping (at most kMaxValidationWindows), first to last byte.
  const int64_t room = size() - split_ - window;  // the last start's offset from split_
  const int64_t n = std::min(kMaxValidationWindows, room / seq_len + 1);
  // Start k at k * room / (n - 1): the last window ends on the last byte, and neighbours are at
  // least floor(room / (n - 1)) >= seq_len apart, so none overlap.
  for (int64_t k = 0; k < n; ++k) {
    validation_starts_.push_back(split_ + (n > 1 ? k * room / (n - 1) : 0));
  }
}

std::pair<torch::Tensor, torch::Tensor> ByteText::windows(
    const std::vector<int64_t>& offsets) const {
  const int64_t n = int64_t(offsets.size());
  auto x = torch::empty({n, seq_len_}, torch::kLong);
  auto y = torch::empty({n, seq_len_}, torch::kLong);
  auto xa = x.accessor<int64_t, 2>();
  auto ya = y.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const auto* at = reinterpret_cast<const unsigned char*>(bytes_.data()) + offsets[size_t(i)];
    for (int64_t t = 0; t < seq_len_; ++t) {
      xa[i][t] = at[t];
      ya[i][t] = at[t + 1];
    }
  }
  return {x, y};
}

std::pair<torch::Tensor, torch::Tensor> ByteText::train_batch(
    const std::vector<int64_t>& starts) const {
  for (const int64_t s : starts) {
    TORCH_CHECK(s >= 0 && s < train_windows(), "ByteText '", path_, "': training window ", s,
                " is outside [0, ", train_windows(), ")");
  }
  return windows(starts);
}

std::pair<torch::Tensor, torch::Tensor> ByteText::validation_batch(int64_t first, int64_t n) const {
  TORCH_CHECK(first >= 0 && n >= 0 && first + n <= validation_windows(), "ByteText '", path_,
              "': validation windows [", first, ", ", first + n, ") are outside [0, ",
              validation_windows(), ")");
  return windows(std::vector<int64_t>(validation_starts_.begin() + first,
                                      validation_starts_.begin() + first + n));
}

double ByteText::unigram_entropy() const {
  std::array<int64_t, 256> counts{};
  for (const char c : train_text()) ++counts[static_cast<unsigned char>(c)];
  double h = 0;
  const double total = double(split_);
  for (const int64_t c : counts) {
    if (c > 0) h -= double(c) / total * std::log(double(c) / total);
  }
  return h;
}

}  // namespace ddp::models
