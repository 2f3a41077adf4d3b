#pragma once
// BindingModel: DistributedDataParallel over a binding's parameters, whose forward the binding
// runs itself: the C ABI calls open_forward before it and close_forward with its outputs, the two
// halves of the forward protocol (wrap/wrapped_model.hpp) that DistributedDataParallel<M>::forward
// runs around a C++ module's forward.

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ddp/gradients/no_sync_guard.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/planner/reachability.hpp"

namespace ddp::c_abi {

class BindingModel : public parallel::DistributedDataParallelBase {
 public:
  // The forward's two halves, each checked against the other (their order is the binding's).
  enum class Phase { kIdle, kInForward };

  BindingModel(std::shared_ptr<torch::nn::Module> tree, comm::ProcessGroupPtr group,
               parallel::DDPOptions options)
      : DistributedDataParallelBase(std::move(tree), std::move(group), std::move(options)) {}

  void open_forward() {
    pre_forward();
    phase_ = Phase::kInForward;
  }
  // Refuses outputs from which no trainable parameter is reachable (a detached tensor, the
  // input): the next backward would reduce nothing, silently. One walk of the outputs' graph per
  // forward under grad mode, as find_unused_parameters makes anyway; with that option such a
  // forward is allowed (every parameter counts as unused, its gradient as zero).
  void close_forward(const std::vector<torch::Tensor>& outputs) {
    phase_ = Phase::kIdle;
    if (torch::GradMode::is_enabled() && !options().gradients.find_unused_parameters) {
      const std::vector<bool> reached = planner::reachable_params(outputs, parameters());
      TORCH_CHECK(std::find(reached.begin(), reached.end(), true) != reached.end(),
                  "none of the model's ", parameters().size(),
                  " trainable parameters is reachable from the ", outputs.size(),
                  " output(s) (a detached tensor, or one the model's parameters did not "
                  "compute): the next backward would reduce no gradient. Pass the forward's "
                  "outputs, or set find_unused_parameters for a forward that may use none");
    }
    end_forward(outputs);
  }
  Phase phase() const { return phase_; }

  bool in_no_sync() const { return no_sync_ != nullptr; }
  void begin_no_sync() { no_sync_.reset(new NoSyncGuard(no_sync())); }
  void end_no_sync() { no_sync_.reset(); }

 private:
  Phase phase_ = Phase::kIdle;
  std::unique_ptr<NoSyncGuard> no_sync_;  // set between no_sync_begin and no_sync_end
};

}  // namespace ddp::c_abi
