#pragma once
// What the docs' C++ blocks may assume without declaring it (doc_snippets.py includes this before
// them): a user's small models, as a user writes them against the installed headers. Each block's
// own <!-- compile-in --> context declares the rest.

#include <torch/torch.h>
#include <ddp/ddp.hpp>

namespace doc_context {

// Four Linear layers, each a unit (fc1..fc4) run through ddp::run_unit.
struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, fc4{nullptr};
  explicit NetImpl(int64_t dim = 8) {
    fc1 = register_module("fc1", torch::nn::Linear(dim, dim));
    fc2 = register_module("fc2", torch::nn::Linear(dim, dim));
    fc3 = register_module("fc3", torch::nn::Linear(dim, dim));
    fc4 = register_module("fc4", torch::nn::Linear(dim, dim));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (torch::nn::Linear* fc : {&fc1, &fc2, &fc3, &fc4}) {
      x = ddp::call_unit(**fc, x);
    }
    return x;
  }
};
TORCH_MODULE(Net);

// A token model with blocks h.0..h.3, each run through ddp::run_unit.
struct GptImpl : torch::nn::Module {
  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList h;
  explicit GptImpl(int64_t vocab = 64, int64_t dim = 32) {
    wte = register_module("wte", torch::nn::Embedding(vocab, dim));
    h = register_module("h", torch::nn::ModuleList());
    for (int i = 0; i < 4; ++i) h->push_back(torch::nn::Linear(dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    torch::Tensor x = wte(idx);
    for (const auto& block : *h) {
      x = ddp::run_unit(
          *block,
          [&](const torch::Tensor& in) { return block->as<torch::nn::Linear>()->forward(in); }, x);
    }
    return torch::matmul(x, wte->weight.t());  // logits, the embedding tied
  }
};
TORCH_MODULE(Gpt);

}  // namespace doc_context
