#pragma once
// GPT-2's initialisation, which the zoo's GPT and Llama share: every Linear and Embedding weight
// ~ N(0, 0.02), Linear biases zero, norms as constructed; in modules() order (fixed by
// construction), so the result depends only on the seed. bench/reference/zoo.py draws the same.

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

namespace ddp::models {

inline void normal_init(torch::nn::Module& root) {
  torch::NoGradGuard no_grad;
  for (const auto& module : root.modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      torch::nn::init::normal_(linear->weight, 0.0, 0.02);
      if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      torch::nn::init::normal_(embedding->weight, 0.0, 0.02);
    }
  }
}

}  // namespace ddp::models
