#include "ddp/io/safetensors.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include "support/error_text.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::error_of;
using ddp::testing::TempDir;

namespace fs = std::filesystem;
using ddp::io::load_safetensors;
using ddp::io::load_safetensors_metadata;
using ddp::io::save_safetensors;
using ddp::io::TensorMap;

// The message of the c10::Error `fn` throws, or "" when it throws none.
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void append_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

// A file as the spec lays it out: length, header (space-padded to 8 unless told), data.
std::vector<uint8_t> file_bytes(std::string header, const std::vector<uint8_t>& data,
                                bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  append_u64(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Values that every dtype holds exactly: small halves for floats, wrapping bytes for U8.
at::Tensor sample(at::ScalarType dtype, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  at::Tensor base = at::arange(numel, at::kLong);
  at::Tensor values;
  if (dtype == at::kBool) {
    values = base.remainder(2).eq(0);
  } else if (dtype == at::kByte) {
    values = (base * 37 + 200).remainder(256).to(dtype);
  } else if (at::isFloatingType(dtype)) {
    values = ((base.remainder(11) - 5).to(at::kDouble) * 0.5).to(dtype);
  } else {
    values = (base.remainder(11) - 5).to(dtype);
  }
  return values.reshape(shape);
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& name) {
  ASSERT_TRUE(got.defined()) << name;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
  EXPECT_EQ(got.sizes(), want.sizes()) << name;
  EXPECT_TRUE(got.is_contiguous()) << name;
  EXPECT_TRUE(got.device().is_cpu()) << name;
  EXPECT_TRUE(at::equal(got, want)) << name << ": got " << got << " want " << want;
}

class SafetensorsDtype : public ::testing::TestWithParam<at::ScalarType> {};

// Shapes that break writers: a matrix, a 0-d scalar, empty tensors, a transposed (non-contiguous)
// view and a narrowed one (storage offset).
TEST_P(SafetensorsDtype, RoundTripsEveryShape) {
  const at::ScalarType dtype = GetParam();
  TempDir dir;
  const at::Tensor big = sample(dtype, {4, 6});
  TensorMap tensors = {
      {"matrix", sample(dtype, {2, 3})}, {"scalar", sample(dtype, {}).reshape({})},
      {"empty", sample(dtype, {0})},     {"empty_2d", sample(dtype, {0, 5})},
      {"transposed", big.t()},           {"narrowed", big.narrow(0, 1, 2).narrow(1, 2, 3)},
  };
  ASSERT_FALSE(tensors["transposed"].is_contiguous());
  ASSERT_FALSE(tensors["narrowed"].is_contiguous());
  const std::string path = dir.file("t.safetensors");
  save_safetensors(path, tensors);
  const TensorMap loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, want] : tensors) expect_same(loaded.at(name), want, name);
  EXPECT_EQ(loaded.at("scalar").dim(), 0);
  EXPECT_TRUE(load_safetensors_metadata(path).empty());
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SafetensorsDtype,
                         ::testing::Values(at::kDouble, at::kFloat, at::kHalf, at::kBFloat16,
                                           at::kLong, at::kInt, at::kShort, at::kChar, at::kByte,
                                           at::kBool),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return std::string(c10::toString(info.param));
                         });

TEST(Safetensors, MetadataRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"quote\"and\\slash", "line\nbreak"}, {"unicode", "\xc3\xa9t\xc3\xa9"}};
  save_safetensors(path, {{"w", at::ones({2}, at::kFloat)}}, metadata);
  EXPECT_EQ(load_safetensors_metadata(path), metadata);
  expect_same(load_safetensors(path).at("w"), at::ones({2}, at::kFloat), "w");
  // Metadata alone, no tensors: an empty data buffer.
  save_safetensors(path, {}, {{"k", "v"}});
  EXPECT_TRUE(load_safetensors(path).empty());
  EXPECT_EQ(load_safetensors_metadata(path), (std::map<std::string, std::string>{{"k", "v"}}));
}

// A file laid out byte by byte as Python's safetensors writes it: metadata first, the data ordered
// by dtype size (I64, then F32, then BF16 and F16), keys in that same order, header space-padded.
TEST(Safetensors, LoadsAFileWrittenByHandToTheSpec) {
  TempDir dir;
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("step":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},)"
                             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},)"
                             R"("h":{"dtype":"F16","shape":[1],"data_offsets":[28,30]},)"
                             R"("mask":{"dtype":"BOOL","shape":[2],"data_offsets":[30,32]}})";
  const std::vector<uint8_t> data = {
      0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // step = -2
      0x00, 0x00, 0xc0, 0x3f,                          // w[0][0] = 1.5f
      0x00, 0x00, 0x00, 0xc0,                          // w[0][1] = -2.0f
      0x00, 0x00, 0x80, 0x3e,                          // w[1][0] = 0.25f
      0x00, 0x00, 0x20, 0x41,                          // w[1][1] = 10.0f
      0x80, 0x3f,                                      // b[0] = 1.0 (bf16 0x3f80)
      0x40, 0xc0,                                      // b[1] = -3.0 (bf16 0xc040)
      0x00, 0x3c,                                      // h[0] = 1.0 (f16 0x3c00)
      0x01, 0x00,                                      // mask = [true, false]
  };
  const std::vector<uint8_t> bytes = file_bytes(header, data);
  ASSERT_EQ((bytes.size() - data.size()) % 8, 0u);
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, bytes);

  const TensorMap t = load_safetensors(path);
  ASSERT_EQ(t.size(), 5u);
  expect_same(t.at("step"), at::scalar_tensor(-2, at::kLong), "step");
  expect_same(t.at("w"), at::tensor({1.5f, -2.0f, 0.25f, 10.0f}).reshape({2, 2}), "w");
  expect_same(t.at("b"), at::tensor({1.0f, -3.0f}).to(at::kBFloat16), "b");
  expect_same(t.at("h"), at::tensor({1.0f}).to(at::kHalf), "h");
  expect_same(t.at("mask"), at::tensor({1, 0}).to(at::kBool), "mask");
  EXPECT_EQ(load_safetensors_metadata(path),
            (std::map<std::string, std::string>{{"format", "pt"}}));
}

// Where name order and dtype order agree, our bytes are exactly the reference's.
TEST(Safetensors, WritesTheReferenceBytes) {
  TempDir dir;
  const std::string path = dir.file("ours.safetensors");
  save_safetensors(path,
                   {{"a", at::tensor({1.5f, -2.0f})}, {"b", at::tensor({1, 0}).to(at::kBool)}},
                   {{"format", "pt"}});
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BOOL","shape":[2],"data_offsets":[8,10]}})";
  EXPECT_EQ(read_bytes(path),
            file_bytes(header, {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x01, 0x00}));
}

TEST(Safetensors, RegionsInAnotherOrderThanTheKeysLoad) {
  TempDir dir;
  const std::string path = dir.file("order.safetensors");
  write_bytes(path, file_bytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                               R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                               {1, 2, 3, 4}));
  const TensorMap t = load_safetensors(path);
  expect_same(t.at("a"), at::tensor({3, 4}).to(at::kByte), "a");
  expect_same(t.at("b"), at::tensor({1, 2}).to(at::kByte), "b");
}

struct Corruption {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string expected;  // a distinctive part of the error
};

std::vector<Corruption> corruptions() {
  const std::string f32x2 = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<uint8_t> eight(8, 0);
  std::vector<uint8_t> beyond;
  append_u64(beyond, 1000);
  beyond.push_back('{');
  return {
      {"ShortFile", {1, 2, 3, 4, 5}, "file is shorter than 8 bytes (5 bytes)"},
      {"HeaderLengthBeyondFile", beyond, "header length 1000 is beyond the file (1 bytes after"},
      {"NotJson", file_bytes(R"({"w": {"dtype": )", {}), "header is not valid JSON"},
      {"NotAnObject", file_bytes("[1, 2]", {}), "header is not a JSON object but array"},
      {"UnknownDtype",
       file_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", {0}),
       "tensor 'w': unknown dtype 'F8_E4M3'"},
      {"NegativeShape", file_bytes(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", {}),
       "tensor 'w': shape [-1] is not a list of non-negative integers"},
      {"FractionalShape",
       file_bytes(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", {0}),
       "tensor 'w': shape [1.5] is not a list of non-negative integers"},
      {"ShapeNotAList",
       file_bytes(R"({"w":{"dtype":"U8","shape":3,"data_offsets":[0,3]}})", {0, 0, 0}),
       "tensor 'w': \"shape\" is missing or not a list"},
      {"OffsetsNotAPair", file_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", {0}),
       "tensor 'w': \"data_offsets\" must be [begin, end]"},
      {"OffsetsBeyondBuffer",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", eight),
       "tensor 'w': data_offsets [4, 12] are not within the data buffer of 8 bytes"},
      {"OffsetsReversed",
       file_bytes(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", eight),
       "tensor 'w': data_offsets [8, 0] are not within the data buffer"},
      {"SizeMismatch",
       file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       "tensor 'w': data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12 bytes"},
      {"Overlap",
       file_bytes(R"({"a":)" + f32x2 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  std::vector<uint8_t>(12, 0)),
       "tensor 'b' at [4, 12] overlaps tensor 'a' at [0, 8]"},
      {"Gap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                  std::vector<uint8_t>(12, 0)),
       "bytes [4, 8) of the data buffer belong to no tensor (gap before tensor 'b')"},
      {"TrailingBytes", file_bytes(R"({"a":)" + f32x2 + "}", std::vector<uint8_t>(11, 0)),
       "file holds 3 trailing bytes after the tensors' data"},
      {"DuplicateName", file_bytes(R"({"a":)" + f32x2 + R"(,"a":)" + f32x2 + "}", eight),
       "duplicate name 'a' in the header"},
      {"MetadataNotStrings", file_bytes(R"({"__metadata__":{"epoch":3}})", {}),
       "\"__metadata__\" value of 'epoch' is not a string"},
      {"BoolNotZeroOrOne",
       file_bytes(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", {1, 2}),
       "tensor 'm' (BOOL) holds byte 2 at element 1"},
  };
}

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

class SafetensorsCorrupt : public ::testing::TestWithParam<Corruption> {};

TEST_P(SafetensorsCorrupt, IsRefusedWithTheFileAndTheProblem) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, GetParam().bytes);
  const std::string err = error_of([&] { load_safetensors(path); });
  EXPECT_NE(err.find(GetParam().expected), std::string::npos) << err;
  EXPECT_NE(err.find("'" + path + "'"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsCorrupt, ::testing::ValuesIn(corruptions()),
                         [](const ::testing::TestParamInfo<Corruption>& info) {
                           return info.param.name;
                         });

TEST(Safetensors, MetadataReaderChecksTheHeaderToo) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                               std::vector<uint8_t>(6, 0)));
  EXPECT_NE(error_of([&] { load_safetensors_metadata(path); }).find("2 trailing bytes"),
            std::string::npos);
}

TEST(Safetensors, MissingFileIsNamed) {
  const std::string err = error_of([] { load_safetensors("/nonexistent/x.safetensors"); });
  EXPECT_NE(err.find("'/nonexistent/x.safetensors': cannot open for reading"), std::string::npos)
      << err;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryAndOverwrites) {
  TempDir dir;
  const std::string path = dir.file("p.safetensors");
  save_safetensors(path, {{"w", at::zeros({3})}});
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"p.safetensors"});
  save_safetensors(path, {{"w", at::full({5}, 2.0)}, {"v", at::ones({1}, at::kInt)}});
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"p.safetensors"});
  const TensorMap t = load_safetensors(path);
  ASSERT_EQ(t.size(), 2u);
  expect_same(t.at("w"), at::full({5}, 2.0), "w");
  expect_same(t.at("v"), at::ones({1}, at::kInt), "v");
}

// A refused save loses nothing already saved: the old file stays, and no temporary is left.
TEST(Safetensors, RefusedSaveKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("p.safetensors");
  save_safetensors(path, {{"w", at::ones({2})}});
  const std::vector<uint8_t> before = read_bytes(path);

  std::string err = error_of([&] {
    save_safetensors(path, {{"w", at::ones({2})}, {"z", at::ones({2}, at::kComplexFloat)}});
  });
  EXPECT_NE(err.find("tensor 'z' has dtype ComplexFloat"), std::string::npos) << err;
  err = error_of([&] { save_safetensors(path, {{"__metadata__", at::ones({1})}}); });
  EXPECT_NE(err.find("cannot be named __metadata__"), std::string::npos) << err;
  err = error_of([&] { save_safetensors(path, {{"u", at::Tensor()}}); });
  EXPECT_NE(err.find("tensor 'u' is undefined"), std::string::npos) << err;

  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"p.safetensors"});
}

TEST(Safetensors, UnwritableDirectoryIsNamed) {
  const std::string err = error_of([] {
    save_safetensors("/nonexistent/dir/p.safetensors", {{"w", at::ones({1})}});
  });
  EXPECT_NE(err.find("cannot create '/nonexistent/dir/p.safetensors.tmp."), std::string::npos)
      << err;
}

}  // namespace
