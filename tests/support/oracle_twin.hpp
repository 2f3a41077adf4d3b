#pragma once
// The one oracle of the equivalence tests, for every style and for tensor parallelism: the model
// built twice by one function, this rank's copy (to be wrapped) and the oracle, which trains in
// this process on each whole global batch while the rank trains on its rows of it; the same
// optimizer on both; and in the end the wrapped model's whole parameters (whole_parameters)
// against the oracle's, name by name, within a relative tolerance (fp32 rounding: 1e-5).

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/global_batches.hpp"
#include "support/oracle.hpp"
#include "support/tiny_gpt.hpp"
#include "support/whole_parameters.hpp"
#include "support/workers.hpp"

namespace ddp::testing {

// `ours`: (name, whole tensor), e.g. whole_parameters(model); each against the oracle's
// parameter of that name (require_close's tolerance and message).
inline void require_close_by_name(const NamedTensors& ours, const torch::nn::Module& oracle,
                                  double rtol, const std::string& context) {
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

struct TwinOptions {
  // Both sides' optimizer (a make_test_optimizer kind, at lr 0.1). Default SGD with momentum: Adam
  // turns the fp32 rounding noise of a gradient that is zero in exact arithmetic into full steps.
  std::string optimizer = "sgd";
  // This rank's copy built after torch::manual_seed(rank), so that the test also proves the
  // wrapper broadcasts rank 0's state; false (seed 0 on every rank) where nothing broadcasts.
  bool rank_seeds = true;
  // Every rank trains on the whole global batch: tensor parallelism, whose ranks see the same
  // data (a rank's rows otherwise).
  bool whole_batches = false;
};

// Nothing to do (regression_step's default after_backward).
struct NoOp {
  void operator()() const {}
};

// Holder: a module holder (models::MLP, torch::nn::Sequential, ...).
template <class Holder>
class OracleTwin {
 public:
  // Calls `make()` twice: this rank's copy (seed: TwinOptions::rank_seeds), then the oracle
  // (seed 0).
  template <class Make>
  OracleTwin(Make make, int world, int rank, TwinOptions options = {})
      : world_(world), rank_(rank), options_(std::move(options)) {
    torch::manual_seed(options_.rank_seeds ? rank : 0);
    net_ = make();
    torch::manual_seed(0);
    oracle_ = make();
  }

  Holder& net() { return net_; }  // this rank's copy: wrap it, then train through the wrapper
  Holder& oracle() { return oracle_; }

  // This rank's rows of a global batch: rows / world consecutive ones (all under whole_batches).
  torch::Tensor mine(const torch::Tensor& global) const {
    if (options_.whole_batches) return global;
    const int64_t per_rank = global.size(0) / world_;
    return global.narrow(0, rank_ * per_rank, per_rank);
  }

  // One step of both: `ours()` runs the wrapped model's forwards and backwards on this rank's
  // rows, `theirs()` the oracle's on the whole batch; then each side's optimizer steps. The
  // optimizers are made at the first step, over the parameters each side has then (a sharded
  // wrapper leaves this rank's shards), a tied parameter once.
  template <class Ours, class Theirs>
  void step(Ours ours, Theirs theirs) {
    if (!opt_) {
      opt_ = make_test_optimizer(options_.optimizer, distinct(net_->parameters()));
      oracle_opt_ = make_test_optimizer(options_.optimizer, distinct(oracle_->parameters()));
    }
    ours();
    opt_->step();
    opt_->zero_grad();
    theirs();
    oracle_opt_->step();
    oracle_opt_->zero_grad();
  }

  // The regression step: MSE of forward(mine(x)) against mine(y), the oracle's on (x, y);
  // `after_backward()` runs between this rank's backward and its optimizer step.
  template <class Forward, class After = NoOp>
  void regression_step(Forward forward, const torch::Tensor& x, const torch::Tensor& y,
                       After after_backward = {}) {
    step(
        [&] {
          torch::mse_loss(forward(mine(x)), mine(y)).backward();
          after_backward();
        },
        [&] { torch::mse_loss(oracle_->forward(x), y).backward(); });
  }

  // `steps` regression steps on regression_batches(steps, rows_per_rank * world, in, out) (the
  // global batch of rows_per_rank rows under whole_batches).
  template <class Forward, class After = NoOp>
  void regression_steps(Forward forward, int steps, int64_t rows_per_rank, int64_t in, int64_t out,
                        After after_backward = {}) {
    const int64_t rows = options_.whole_batches ? rows_per_rank : rows_per_rank * world_;
    const GlobalBatches batches = regression_batches(steps, rows, in, out);
    for (int s = 0; s < steps; ++s) {
      regression_step(forward, batches.x[s], batches.y[s], after_backward);
    }
  }

  // `whole` (whole_parameters of the wrapped model) against the oracle's parameters.
  void require_close(const NamedTensors& whole, double rtol, const std::string& context) const {
    require_close_by_name(whole, *oracle_, rtol, context);
  }

 private:
  int world_, rank_;
  TwinOptions options_;
  Holder net_{nullptr}, oracle_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt_, oracle_opt_;
};

}  // namespace ddp::testing
