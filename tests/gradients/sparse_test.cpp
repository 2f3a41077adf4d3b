#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// A bag-of-tokens regressor whose embedding produces sparse gradients.
struct SparseNet : torch::nn::Module {
  SparseNet() {
    emb = register_module("emb",
                          torch::nn::Embedding(torch::nn::EmbeddingOptions(50, 8).sparse(true)));
    fc = register_module("fc", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& idx) { return fc(emb(idx).mean(1)); }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
};

std::pair<torch::Tensor, torch::Tensor> sample(int64_t offset, int64_t n) {
  // Sample i depends only on i: tokens (i * 7 + j * 3) % 50, target from the first token.
  auto idx = torch::empty({n, 5}, torch::kLong);
  auto y = torch::empty({n, 3});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = offset + i;
    for (int64_t j = 0; j < 5; ++j) idx[i][j] = (g * 7 + j * 3) % 50;
    for (int64_t k = 0; k < 3; ++k) y[i][k] = std::sin(0.3 * static_cast<double>(g + k));
  }
  return {idx, y};
}

// Four steps of plain SGD (libtorch's momentum does not take sparse gradients) on 12-sample global
// batches, against the oracle on each whole batch.
DDP_TEST_WORKER(sparse) {
  auto pg = worker_process_group();
  constexpr int64_t kGlobal = 12;
  OracleTwin<std::shared_ptr<SparseNet>> twin([] { return std::make_shared<SparseNet>(); },
                                              pg->world_size(), pg->rank(), {"plain-sgd"});
  parallel::DistributedDataParallel<std::shared_ptr<SparseNet>> model(twin.net(), pg);
  for (int step = 0; step < 4; ++step) {
    const auto batch = sample(step * kGlobal, kGlobal);
    const torch::Tensor &x = batch.first, &y = batch.second;
    twin.step(
        [&] {
          torch::mse_loss(model(twin.mine(x)), twin.mine(y)).backward();
          require(twin.net()->emb->weight.grad().is_sparse(),
                  "the embedding's gradient must stay sparse");
        },
        [&] { torch::mse_loss(twin.oracle()->forward(x), y).backward(); });
  }
  twin.require_close(whole_parameters(model), 1e-5, "sparse embedding");
}

DDP_WORKER_TEST_PER_WORLD(Sparse, EmbeddingWithSparseGradientsMatchesTheOracle, sparse, 1, 2, 3);

}  // namespace
}  // namespace ddp::testing
