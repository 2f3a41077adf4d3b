#pragma once
// The shape of most data-parallel equivalence tests: `steps` steps of SGD with momentum 0.9 on an
// MSE regression, the wrapped model on rank r's 3 samples of each global batch and the oracle on
// the whole batch (seed 1), then the wrapped model's whole parameters compared with the oracle's.

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "support/oracle.hpp"
#include "support/workers.hpp"

namespace ddp::testing {

// `model(x)` is the wrapped forward; `params` what its optimizer steps (the module's, after
// wrapping); `oracle` the single-process module.
template <typename Forward, typename Oracle>
void regression_steps(Forward model, std::vector<torch::Tensor> params, Oracle& oracle, int world,
                      int rank, int64_t in, int64_t out, int steps) {
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD oracle_opt(oracle->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(1);
  for (int s = 0; s < steps; ++s) {
    const auto x = torch::randn({3 * world, in});
    const auto y = torch::randn({3 * world, out});
    torch::mse_loss(model(x.narrow(0, 3 * rank, 3)), y.narrow(0, 3 * rank, 3)).backward();
    opt.step();
    opt.zero_grad();
    torch::mse_loss(oracle->forward(x), y).backward();
    oracle_opt.step();
    oracle_opt.zero_grad();
  }
}

// `ours`: (name, whole tensor), e.g. whole_parameters(model); each against the oracle's
// parameter of that name (require_close's tolerance and message).
inline void require_close_by_name(const std::vector<std::pair<std::string, torch::Tensor>>& ours,
                                  const torch::nn::Module& oracle, double rtol,
                                  const std::string& context) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> a, b;
  const auto reference = oracle.named_parameters();
  for (const auto& [name, t] : ours) {
    const auto* found = reference.find(name);
    require(found != nullptr, context + ": the oracle has no parameter '" + name + "'");
    names.push_back(name);
    a.push_back(t);
    b.push_back(*found);
  }
  require_close(names, a, b, rtol, context);
}

}  // namespace ddp::testing
