// models::ByteText (ddp-train --data): the 90/10 split, the windows (y is x shifted by one), the
// fixed validation windows, the unigram entropy, and the refusals by exact text.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>

#include "ddp/models/byte_text.hpp"
#include "support/error_text.hpp"
#include "support/temp_dir.hpp"

namespace ddp::models {
namespace {

using ddp::testing::error_of;

std::string write(const ddp::testing::TempDir& dir, const std::string& name,
                  const std::string& bytes) {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Byte i of the test text: every value 0..255 occurs, NUL and high bytes included.
std::string counting_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) % 256);
  return s;
}

TEST(ByteText, SplitsNinetyTenAndShiftsTargetsByOne) {
  const ddp::testing::TempDir dir("byte_text");
  const std::string bytes = counting_bytes(1000);
  const ByteText text(write(dir, "t.bin", bytes), 8);
  EXPECT_EQ(text.size(), 1000);
  EXPECT_EQ(text.train_text().size(), 900u);
  EXPECT_EQ(text.validation_text().size(), 100u);
  EXPECT_EQ(text.train_windows(), 892);  // starts 0..891: the last window ends at byte 899

  const auto [x, y] = text.train_batch({0, 5, 891});
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{3, 8}));
  ASSERT_EQ(x.scalar_type(), torch::kLong);
  const int64_t starts[] = {0, 5, 891};
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(x[i][t].item<int64_t>(), static_cast<unsigned char>(bytes[starts[i] + t]));
      EXPECT_EQ(y[i][t].item<int64_t>(), static_cast<unsigned char>(bytes[starts[i] + t + 1]));
    }
  }
  EXPECT_NE(error_of([&] { text.train_batch({892}); }), "");  // would read validation bytes
}

// 100 validation bytes, windows of 9: (100 - 9) / 8 + 1 = 12 non-overlapping windows, spread from
// the first byte to the last; every one inside the validation part.
TEST(ByteText, ValidationWindowsAreFixedAndInsideTheValidationPart) {
  const ddp::testing::TempDir dir("byte_text");
  const std::string bytes = counting_bytes(1000);
  const ByteText text(write(dir, "t.bin", bytes), 8);
  ASSERT_EQ(text.validation_windows(), 12);
  const auto [x, y] = text.validation_batch(0, 12);
  // The first window starts at the split, the last ends at the file's last byte.
  EXPECT_EQ(x[0][0].item<int64_t>(), static_cast<unsigned char>(bytes[900]));
  EXPECT_EQ(y[11][7].item<int64_t>(), static_cast<unsigned char>(bytes[999]));
  const auto [x1, y1] = text.validation_batch(3, 2);
  EXPECT_TRUE(torch::equal(x1, x.slice(0, 3, 5)));
  EXPECT_TRUE(torch::equal(y1, y.slice(0, 3, 5)));
}

TEST(ByteText, ValidationWindowsAreCappedOnALargeFile) {
  const ddp::testing::TempDir dir("byte_text");
  const ByteText text(write(dir, "big.bin", counting_bytes(100000)), 8);
  EXPECT_EQ(text.validation_windows(), ByteText::kMaxValidationWindows);
}

// Two byte values, equally often: ln 2 nats per byte.
TEST(ByteText, UnigramEntropyOfTheTrainingPart) {
  const ddp::testing::TempDir dir("byte_text");
  std::string bytes;
  for (int i = 0; i < 500; ++i) bytes += "ab";
  const ByteText text(write(dir, "ab.txt", bytes), 4);
  EXPECT_NEAR(text.unigram_entropy(), std::log(2.0), 1e-12);
}

TEST(ByteText, RefusesFilesThatCannotHoldASequenceByName) {
  const ddp::testing::TempDir dir("byte_text");
  const std::string missing = dir.file("missing.txt");
  EXPECT_EQ(error_of([&] { ByteText(missing, 32); }),
            "cannot read the text file '" + missing + "': No such file or directory");
  EXPECT_EQ(error_of([&] { ByteText(dir.str(), 32); }),
            "cannot read the text file '" + dir.str() + "': Is a directory");
  const std::string empty = write(dir, "empty.txt", "");
  EXPECT_EQ(error_of([&] { ByteText(empty, 32); }),
            "the text file '" + empty + "' is empty: there is nothing to train on");
  const std::string short_file = write(dir, "short.txt", std::string(32, 'x'));
  EXPECT_EQ(error_of([&] { ByteText(short_file, 32); }),
            "the text file '" + short_file +
                "' has 32 bytes, shorter than one sequence: a sample is seq_len + 1 = 33 bytes "
                "(32 inputs and the byte after them)");
  // 320 bytes: 288 for training, 32 for validation, one short of a window.
  const std::string no_validation = write(dir, "no_val.txt", std::string(320, 'x'));
  EXPECT_EQ(error_of([&] { ByteText(no_validation, 32); }),
            "the text file '" + no_validation +
                "' has 320 bytes: its validation part (the last 10%, 32 bytes) is shorter than "
                "one sequence of 33 bytes; a file of at least 321 bytes is needed");
}

// min_file_size is the boundary: one byte less fails, exactly it works, for several lengths.
TEST(ByteText, MinFileSizeIsTheSmallestThatWorks) {
  const ddp::testing::TempDir dir("byte_text");
  for (const int64_t seq_len : {1, 2, 7, 32, 64}) {
    const int64_t n = ByteText::min_file_size(seq_len);
    const std::string ok = write(dir, "ok.txt", std::string(size_t(n), 'x'));
    EXPECT_EQ(error_of([&] { ByteText(ok, seq_len); }), "") << seq_len;
    EXPECT_EQ(ByteText(ok, seq_len).validation_windows(), 1) << seq_len;
    const std::string small = write(dir, "small.txt", std::string(size_t(n - 1), 'x'));
    EXPECT_NE(error_of([&] { ByteText(small, seq_len); }), "") << seq_len;
  }
}

}  // namespace
}  // namespace ddp::models
