#include "ddp/models/tasks.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

namespace ddp::models {
namespace {

// splitmix64's finalizer: neighbouring inputs (sample i, i + 1) give unrelated outputs, so
// per-sample seeds derived from one user seed do not produce correlated streams.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Separate streams keep the teacher from reusing the random numbers of any sample.
enum class Stream : uint64_t { kTeacher = 1, kSample = 2 };

uint64_t stream_seed(uint64_t seed, Stream stream, uint64_t index) {
  return mix(mix(mix(seed) ^ static_cast<uint64_t>(stream)) ^ index);
}

at::Generator cpu_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

void check_range(const char* workload, int64_t offset, int64_t n) {
  TORCH_CHECK(offset >= 0 && n >= 0, workload,
              ": batch(offset, n) needs offset >= 0 and n >= 0, got offset=", offset, " n=", n);
}

torch::Tensor squared_error(const torch::Tensor& output, const torch::Tensor& target) {
  TORCH_CHECK(output.sizes() == target.sizes(), "regression loss: output ", output.sizes(),
              " and target ", target.sizes(), " differ in shape");
  // Summed over features, not averaged: a mean over features divides every gradient by the
  // width, and a 256-wide model would then barely move in 100 steps at lr 0.1.
  return (output.to(target.scalar_type()) - target).pow(2).sum(-1).mean();
}

torch::Tensor token_cross_entropy(const torch::Tensor& output, const torch::Tensor& target) {
  TORCH_CHECK(output.dim() == target.dim() + 1, "classification loss: logits ", output.sizes(),
              " need one more dim than targets ", target.sizes());
  return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}),
                                              target.reshape({-1}));
}

// Integer samples need no generator: the mixed per-sample seed is itself uniform.
int64_t sample_token(uint64_t seed, int64_t i, int64_t vocab) {
  return static_cast<int64_t>(stream_seed(seed, Stream::kSample, static_cast<uint64_t>(i)) %
                              static_cast<uint64_t>(vocab));
}

}  // namespace

// Regression onto a fixed linear teacher x -> (x U) V of rank r = min(16, in, out) with singular
// values falling as 1/k. Low rank keeps the teacher cheap at width 8192 (two thin matmuls instead
// of a dim x dim one); the falling spectrum gives a dominant direction that even the attenuating
// default init of a ReLU MLP picks up within ~100 steps, while gradients stay well above rank 1
// (a rank-1 task would flatter low-rank gradient compression such as PowerSGD).
//
// Samples come from a generator seeded per sample, so sample i is bitwise the same in any (offset,
// n). The teacher runs in double: a batched float matmul rounds differently for different batch
// sizes (BLAS blocking), and double rounded to float hides that.
void add_regression_task(Workload& w, int64_t in, int64_t out, uint64_t seed) {
  const int64_t rank = std::min<int64_t>({16, in, out});
  auto gen = cpu_generator(stream_seed(seed, Stream::kTeacher, 0));
  const auto dbl = torch::TensorOptions().dtype(torch::kDouble);
  auto spectrum = 1.0 / torch::arange(1, rank + 1, dbl);
  spectrum /= spectrum.pow(2).sum().sqrt();  // E|target|^2 = sum of squares = 1 for white x
  // Columns of U and rows of V have unit expected norm, so x U has unit-variance entries.
  const auto u = torch::randn({in, rank}, gen, dbl) / std::sqrt(static_cast<double>(in));
  const auto v = torch::randn({rank, out}, gen, dbl) / std::sqrt(static_cast<double>(out)) *
                 spectrum.unsqueeze(1);
  const std::string name = w.name;
  w.batch = [name, in, seed, u, v](int64_t offset, int64_t n) {
    check_range(name.c_str(), offset, n);
    auto x = torch::empty({n, in}, torch::kFloat);
    for (int64_t j = 0; j < n; ++j) {
      const auto sample = static_cast<uint64_t>(offset + j);
      x.select(0, j).normal_(0.0, 1.0, cpu_generator(stream_seed(seed, Stream::kSample, sample)));
    }
    auto y = x.to(torch::kDouble).mm(u).mm(v).to(torch::kFloat);
    return std::make_pair(x, y);
  };
  w.loss = squared_error;
}

// Sequences s, s+1, ..., s+T (mod vocab) with a random start s: inputs are the first T tokens,
// targets the last T. Predictable from the current token alone, so plain SGD learns it: at lr 0.1
// "gpt" falls from ln(256) = 5.6 to ~4.4 in 100 steps and below 0.5 by ~260.
void add_counting_task(Workload& w, int64_t vocab, int64_t seq_len, uint64_t seed) {
  const std::string name = w.name;
  w.batch = [name, vocab, seq_len, seed](int64_t offset, int64_t n) {
    check_range(name.c_str(), offset, n);
    auto start = torch::empty({n, 1}, torch::kLong);
    auto acc = start.accessor<int64_t, 2>();
    for (int64_t j = 0; j < n; ++j) acc[j][0] = sample_token(seed, offset + j, vocab);
    const auto steps = torch::arange(seq_len, torch::kLong).unsqueeze(0);
    auto x = (start + steps).remainder(vocab);
    auto y = (start + steps + 1).remainder(vocab);
    return std::make_pair(x, y);
  };
  w.loss = token_cross_entropy;
}

// target = (3 * input + 1) mod vocab: a function of the input, hence learnable, and a permutation
// of the vocabulary whenever 3 does not divide vocab (32 here), so every class occurs.
void add_affine_token_task(Workload& w, int64_t vocab, uint64_t seed) {
  const std::string name = w.name;
  w.batch = [name, vocab, seed](int64_t offset, int64_t n) {
    check_range(name.c_str(), offset, n);
    auto x = torch::empty({n}, torch::kLong);
    auto acc = x.accessor<int64_t, 1>();
    for (int64_t j = 0; j < n; ++j) acc[j] = sample_token(seed, offset + j, vocab);
    auto y = (x * 3 + 1).remainder(vocab);
    return std::make_pair(x, y);
  };
  w.loss = token_cross_entropy;
}

// Class c is an oriented colour grating: cos(2 pi * 4 / 32 * (h cos t_c + w sin t_c) + phase)
// on each channel ch scaled by a fixed unit colour v_c[ch], with t_c = pi * c / classes, under
// N(0, 1) noise of the same amplitude. The label and the phase (uniform in [0, 2 pi)) are drawn
// per sample, so the class is the grating's orientation and colour, never its position: a CNN
// with global average pooling learns it, and a trained one separates the classes. Samples come
// from a generator seeded per sample (sample i is the same in any (offset, n)).
void add_image_class_task(Workload& w, int64_t classes, uint64_t seed) {
  auto gen = cpu_generator(stream_seed(seed, Stream::kTeacher, 0));
  auto colours = torch::randn({classes, 3}, gen);
  colours /= colours.pow(2).sum(1, /*keepdim=*/true).sqrt();
  const auto pixels = torch::arange(32, torch::kFloat);
  const auto rows = pixels.view({32, 1}), cols = pixels.view({1, 32});
  const std::string name = w.name;
  w.batch = [name, seed, classes, colours, rows, cols](int64_t offset, int64_t n) {
    check_range(name.c_str(), offset, n);
    auto x = torch::empty({n, 3, 32, 32}, torch::kFloat);
    auto y = torch::empty({n}, torch::kLong);
    auto labels = y.accessor<int64_t, 1>();
    constexpr double kPi = 3.14159265358979323846;
    for (int64_t j = 0; j < n; ++j) {
      auto sample_gen =
          cpu_generator(stream_seed(seed, Stream::kSample, static_cast<uint64_t>(offset + j)));
      const int64_t label = torch::randint(classes, {1}, sample_gen).item<int64_t>();
      const double phase = 2 * kPi * torch::rand({1}, sample_gen).item<double>();
      const double angle = kPi * static_cast<double>(label) / static_cast<double>(classes);
      const auto grating = torch::cos(
          (rows * std::cos(angle) + cols * std::sin(angle)) * (2 * kPi * 4 / 32) + phase);
      x.select(0, j).normal_(0.0, 1.0, sample_gen).add_(colours[label].view({3, 1, 1}) * grating);
      labels[j] = label;
    }
    return std::make_pair(x, y);
  };
  w.loss = token_cross_entropy;
}

}  // namespace ddp::models
