#include "ddp/models/small_models.hpp"

#include <c10/util/Exception.h>

#include "replace_parameter.hpp"

namespace ddp::models {

BatchNormNetImpl::BatchNormNetImpl(int64_t in, int64_t hidden, int64_t out) {
  TORCH_CHECK(in > 0 && hidden > 0 && out > 0, "BatchNormNet: sizes must be positive, got in=", in,
              " hidden=", hidden, " out=", out);
  fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
  bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
}

torch::Tensor BatchNormNetImpl::forward(const torch::Tensor& x) {
  return fc2(torch::relu(bn(fc1(x))));
}

UnusedBranchNetImpl::UnusedBranchNetImpl(int64_t dim) {
  TORCH_CHECK(dim > 0, "UnusedBranchNet: dim must be positive, got ", dim);
  fc1 = register_module("fc1", torch::nn::Linear(dim, dim));
  fc2 = register_module("fc2", torch::nn::Linear(dim, dim));
  unused = register_module("unused", torch::nn::Linear(dim, dim));
}

torch::Tensor UnusedBranchNetImpl::forward(const torch::Tensor& x) {
  return fc2(torch::relu(fc1(x)));
}

TiedNetImpl::TiedNetImpl(int64_t vocab, int64_t dim) {
  TORCH_CHECK(vocab > 0 && dim > 0, "TiedNet: sizes must be positive, got vocab=", vocab,
              " dim=", dim);
  emb = register_module("emb", torch::nn::Embedding(vocab, dim));
  fc = register_module("fc", torch::nn::Linear(dim, dim));
  head =
      register_module("head", torch::nn::Linear(torch::nn::LinearOptions(dim, vocab).bias(false)));
  // Embedding's weight is [vocab, dim], exactly the shape of a Linear(dim, vocab) weight.
  head->weight = emb->weight;
  detail::replace_parameter(*head, "weight", emb->weight);
}

torch::Tensor TiedNetImpl::forward(const torch::Tensor& idx) {
  return head(torch::tanh(fc(emb(idx))));
}

OutOfOrderNetImpl::OutOfOrderNetImpl(int64_t dim) {
  TORCH_CHECK(dim > 0, "OutOfOrderNet: dim must be positive, got ", dim);
  fc1 = register_module("fc1", torch::nn::Linear(dim, dim));
  fc2 = register_module("fc2", torch::nn::Linear(dim, dim));
  fc3 = register_module("fc3", torch::nn::Linear(dim, dim));
}

torch::Tensor OutOfOrderNetImpl::forward(const torch::Tensor& x) {
  auto y = torch::tanh(fc3(x));
  y = torch::tanh(fc1(y));
  return fc2(y);
}

}  // namespace ddp::models
