#pragma once
// The small GPT the equivalence tests train, and the parameter list an optimizer of a tied model
// must see.

#include <torch/torch.h>

#include <vector>

#include "ddp/models/gpt.hpp"

namespace ddp::testing {

// vocab 37 (uneven at world 2 and 3), 8 tokens, width 16.
inline models::GPTConfig tiny_gpt(int64_t n_layers, int64_t n_heads = 2, bool tied = true) {
  models::GPTConfig c;
  c.vocab_size = 37;
  c.seq_len = 8;
  c.d_model = 16;
  c.n_heads = n_heads;
  c.n_layers = n_layers;
  c.tie_weights = tied;
  return c;
}

// parameters() lists a tied weight under each name; an optimizer must see it once.
inline std::vector<torch::Tensor> distinct(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

}  // namespace ddp::testing
