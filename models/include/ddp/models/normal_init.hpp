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
