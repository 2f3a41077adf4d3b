#include "support/test_nets.hpp"

#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <algorithm>

#include "ddp/models/replace_parameter.hpp"
#include "ddp/models/tasks.hpp"
#include "ddp/unit/activation_checkpoint.hpp"

namespace ddp::testing {

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
  models::detail::replace_parameter(*head, "weight", emb->weight);
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

torch::Tensor CheckpointNetImpl::forward(const torch::Tensor& x) {
  const auto h = ddp::activation_checkpoint(
      *fc1, [this](const torch::Tensor& in) { return fc1(in); }, x);
  return fc4(fc3(fc2(h)));
}

namespace {

int64_t pick(int64_t dim, int64_t fallback) { return dim == 0 ? fallback : dim; }

}  // namespace

models::Workload make_test_workload(const std::string& name,
                                    const models::WorkloadOptions& options) {
  using models::add_affine_token_task;
  using models::add_regression_task;
  using models::set_model;
  const bool test_net = name == "batchnorm" || name == "unused-branch" || name == "tied" ||
                        name == "out-of-order" || name == "net-checkpoint";
  if (!test_net) return models::make_workload(name, options);
  TORCH_CHECK(options.dim >= 0, "make_test_workload('", name,
              "'): dim must be >= 0 (0 = the model's default), got ", options.dim);
  models::Workload w;
  w.name = name;
  // As in make_workload: every process builds the same initial model without a broadcast.
  torch::manual_seed(options.seed);
  const int64_t dim = options.dim;
  const uint64_t seed = options.seed;
  if (name == "batchnorm") {
    set_model(w, BatchNormNet(16, pick(dim, 32), 4));
    add_regression_task(w, 16, 4, seed);
  } else if (name == "unused-branch") {
    const int64_t width = pick(dim, 16);
    set_model(w, UnusedBranchNet(width));
    add_regression_task(w, width, width, seed);
  } else if (name == "tied") {
    const int64_t vocab = 32;
    set_model(w, TiedNet(vocab, pick(dim, 16)));
    add_affine_token_task(w, vocab, seed);
  } else if (name == "net-checkpoint") {
    // As make_workload("net"): the same seed, parameters and task, so "net" is the oracle.
    const int64_t width = pick(dim, 2000);
    set_model(w, CheckpointNet(width));
    add_regression_task(w, width, width, seed);
    w.lr = std::min(0.05, 20.0 / static_cast<double>(width));
  } else {  // out-of-order
    const int64_t width = pick(dim, 16);
    set_model(w, OutOfOrderNet(width));
    add_regression_task(w, width, width, seed);
  }
  return w;
}

}  // namespace ddp::testing
