#pragma once
// The global batches of a regression test, drawn once: every rank draws the same ones, a rank
// trains on its slice of each and the oracle on the whole.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace ddp::testing {

struct GlobalBatches {
  std::vector<torch::Tensor> x;  // [rows, in] per step
  std::vector<torch::Tensor> y;  // [rows, out] per step
};

// `steps` batches of `rows` samples after torch::manual_seed(seed), inputs and targets N(0, 1),
// drawn step by step (x, then y).
inline GlobalBatches regression_batches(int64_t steps, int64_t rows, int64_t in, int64_t out,
                                        uint64_t seed = 1) {
  torch::manual_seed(seed);
  GlobalBatches b;
  for (int64_t s = 0; s < steps; ++s) {
    b.x.push_back(torch::randn({rows, in}));
    b.y.push_back(torch::randn({rows, out}));
  }
  return b;
}

}  // namespace ddp::testing
