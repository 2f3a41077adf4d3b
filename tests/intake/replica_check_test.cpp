#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/intake/replica_check.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::parallel {
namespace {

using intake::compare_signatures;
using intake::replica_signature;

TEST(ReplicaCheck, EqualSignaturesPass) {
  EXPECT_EQ(compare_signatures({{"a", "b"}, {"a", "b"}, {"a", "b"}}), "");
}

TEST(ReplicaCheck, FirstDifferenceIsNamedWithBothRanks) {
  EXPECT_EQ(compare_signatures({{"a", "b", "c"}, {"a", "b", "c"}, {"a", "B", "c"}}),
            "ddp: model replicas differ across ranks at entry 1: rank 0 has b, rank 2 has B. "
            "Every rank must construct the same model.");
}

TEST(ReplicaCheck, DifferentCountsNameTheExtraEntry) {
  EXPECT_EQ(compare_signatures({{"a"}, {"a", "extra"}}),
            "ddp: model replicas differ across ranks: rank 0 has 1 parameters and buffers, rank 1 "
            "has 2; the first one only rank 1 has is extra. Every rank must construct the same "
            "model.");
}

TEST(ReplicaCheck, SignatureNamesShapeAndDtype) {
  const auto sig = replica_signature({"fc.weight"}, {torch::zeros({2, 3})}, "parameter");
  EXPECT_EQ(sig, std::vector<std::string>{"parameter 'fc.weight' shape [2, 3] dtype Float"});
}

struct TwoLayer : torch::nn::Module {
  explicit TwoLayer(int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(4, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(fc1(x)); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Rank 1 builds a wider hidden layer: every rank must get the same error naming fc1.weight.
DDP_TEST_WORKER(mismatched_shapes) {
  auto pg = testing::worker_process_group();
  auto module = std::make_shared<TwoLayer>(pg->rank() == 1 ? 9 : 8);
  std::string error;
  try {
    DistributedDataParallel<std::shared_ptr<TwoLayer>> model(module, pg);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  const std::string expected =
      "ddp: model replicas differ across ranks at entry 0: rank 0 has parameter 'fc1.weight' "
      "shape [8, 4] dtype Float, rank 1 has parameter 'fc1.weight' shape [9, 4] dtype Float";
  testing::require(error.find(expected) != std::string::npos, "got: " + error);
}

DDP_WORKER_TEST_PER_WORLD(Mismatch, ShapeMismatchAcrossRanksNamesTheParameter, mismatched_shapes, 2,
                          3);

}  // namespace
}  // namespace ddp::parallel
