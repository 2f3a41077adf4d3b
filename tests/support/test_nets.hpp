#pragma once
// Test-only nets, each shaped to exercise one DDP corner case: buffers, parameters that get no
// gradient, a parameter registered under two names, and a backward order that differs from the
// registration order. Small enough for multi-process CPU tests. Compiled into the test binary
// only: the tools' --model zoo (ddp/models/registry.hpp) does not offer them.

#include <cstdint>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "ddp/models/net.hpp"
#include "ddp/models/registry.hpp"

namespace ddp::testing {

// fc1 -> bn -> relu -> fc2. bn carries the buffers running_mean, running_var and
// num_batches_tracked, which DDP broadcasts from rank 0 rather than reducing.
class BatchNormNetImpl : public torch::nn::Module {
 public:
  explicit BatchNormNetImpl(int64_t in = 16, int64_t hidden = 32, int64_t out = 4);

  // x: [B, in] with B >= 2 in training mode (batch statistics need two samples).
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(BatchNormNet);

// fc2(relu(fc1(x))); "unused" is registered after them and never called, so its
// parameters never receive a gradient (find_unused_parameters territory).
class UnusedBranchNetImpl : public torch::nn::Module {
 public:
  explicit UnusedBranchNetImpl(int64_t dim = 16);

  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Linear unused{nullptr};
};
TORCH_MODULE(UnusedBranchNet);

// head(tanh(fc(emb(idx)))) where head->weight is the same tensor as emb->weight. The tensor
// appears twice in named_parameters() (emb.weight and head.weight; libtorch does not deduplicate)
// and its gradient is the sum of both uses. clone() unties the two.
class TiedNetImpl : public torch::nn::Module {
 public:
  explicit TiedNetImpl(int64_t vocab = 32, int64_t dim = 16);

  // idx: int64 [B] -> logits [B, vocab].
  torch::Tensor forward(const torch::Tensor& idx);

  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TiedNet);

// Registered fc1, fc2, fc3 but applied fc3, fc1, fc2 (tanh between), so gradients become ready in
// the order fc2, fc1, fc3: neither registration order nor its reverse.
class OutOfOrderNetImpl : public torch::nn::Module {
 public:
  explicit OutOfOrderNetImpl(int64_t dim = 16);

  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Linear fc3{nullptr};
};
TORCH_MODULE(OutOfOrderNet);

// The seed test's Net(checkpoint=True): models::Net's parameters (same names, same init from the
// same seed), fc1 under ddp::activation_checkpoint. fc1's input needs no gradient, so only the
// parameters carry fc1's gradient out of the checkpoint (the case a reentrant checkpoint gets
// wrong).
class CheckpointNetImpl : public models::NetImpl {
 public:
  explicit CheckpointNetImpl(int64_t dim = 2000) : models::NetImpl(dim) {}

  torch::Tensor forward(const torch::Tensor& x);
};
TORCH_MODULE(CheckpointNet);

// make_workload for the test nets by name, the zoo's otherwise:
//   batchnorm      BatchNormNet(16, 32, 4)          dim: hidden         regression
//   unused-branch  UnusedBranchNet(16)              dim: width          regression
//   tied           TiedNet(32, 16)                  dim: embedding dim  classification
//   out-of-order   OutOfOrderNet(16)                dim: width          regression
//   net-checkpoint CheckpointNet(2000)              dim: width          regression, as "net"
// Tasks as in registry.hpp; classification (tied): target = (3 * input + 1) mod vocab, cross
// entropy, mean over the batch. Calls torch::manual_seed(options.seed), like make_workload.
models::Workload make_test_workload(const std::string& name,
                                    const models::WorkloadOptions& options = {});

}  // namespace ddp::testing
