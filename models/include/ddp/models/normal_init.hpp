#pragma once
// GPT-2's initialisation, which the zoo's GPT and Llama share: every Linear and Embedding weight
// ~ N(0, 0.02), Linear biases zero, norms as constructed; in modules() order (fixed by
// construction), so the result depends only on the seed. bench/reference/zoo.py draws the same.
// Through shard::fill_full: under deferred initialisation (a parameter already reduced to this
// rank's rows) the same draws fill a whole temporary whose rows are kept again.

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "ddp/shard/deferred_init.hpp"

namespace ddp::models {

// A Linear whose weight (and bias) normal_init writes. Under local draws libtorch's constructor
// would draw the whole weight on the CPU only for fill_full to throw it away (llama-8b: ~8 B
// values, serial): then it is built 1 x 1 and widened to unfilled values ([Note: constructors'
// draws] in shard/deferred_init.hpp). Otherwise built as libtorch builds it, the same draws as
// always.
inline torch::nn::Linear normal_linear(int64_t in, int64_t out, bool bias = true) {
  if (!shard::draws_locally()) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  }
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(bias));
  linear->options.in_features(in).out_features(out);
  linear->weight.set_data(shard::unfilled({out, in}, linear->weight.options()));
  if (bias) linear->bias.set_data(shard::unfilled({out}, linear->bias.options()));
  return linear;
}

// An Embedding whose weight normal_init writes, as normal_linear.
inline torch::nn::Embedding normal_embedding(int64_t count, int64_t dim) {
  if (!shard::draws_locally()) return torch::nn::Embedding(count, dim);
  torch::nn::Embedding embedding(1, 1);
  embedding->options.num_embeddings(count).embedding_dim(dim);
  embedding->weight.set_data(shard::unfilled({count, dim}, embedding->weight.options()));
  return embedding;
}

inline void normal_init(torch::nn::Module& root) {
  torch::NoGradGuard no_grad;
  for (const auto& module : root.modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      shard::fill_full(linear->weight, [](at::Tensor& w) { w.normal_(0.0, 0.02); });
      if (linear->bias.defined()) shard::fill_full(linear->bias, [](at::Tensor& b) { b.zero_(); });
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      shard::fill_full(embedding->weight, [](at::Tensor& w) { w.normal_(0.0, 0.02); });
    }
  }
}

}  // namespace ddp::models
