#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/oracle.hpp"
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

std::vector<torch::Tensor> train(comm::ProcessGroupPtr pg, bool distributed) {
  torch::manual_seed(7);
  auto module = std::make_shared<SparseNet>();
  const int world = pg->world_size();
  const int64_t global = 12, shard = global / world;
  // Plain SGD: libtorch's momentum does not take sparse gradients.
  std::unique_ptr<parallel::DistributedDataParallel<std::shared_ptr<SparseNet>>> model;
  if (distributed) {
    model =
        std::make_unique<parallel::DistributedDataParallel<std::shared_ptr<SparseNet>>>(module, pg);
  }
  torch::optim::SGD opt(module->parameters(), 0.2);
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    if (distributed) {
      auto [x, y] = sample(step * global + pg->rank() * shard, shard);
      torch::mse_loss((*model)(x), y).backward();
      require(module->emb->weight.grad().is_sparse(), "the embedding's gradient must stay sparse");
    } else {
      auto [x, y] = sample(step * global, global);
      torch::mse_loss(module->forward(x), y).backward();
    }
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : module->parameters()) out.push_back(p.detach().clone());
  return out;
}

DDP_TEST_WORKER(sparse) {
  auto pg = worker_process_group();
  const auto oracle = train(pg, false);
  const auto got = train(pg, true);
  require_close({"emb.weight", "fc.weight", "fc.bias"}, got, oracle, 1e-5, "sparse embedding");
}

DDP_WORKER_TEST_PER_WORLD(Sparse, EmbeddingWithSparseGradientsMatchesTheOracle, sparse, 1, 2, 3);

}  // namespace
}  // namespace ddp::testing
