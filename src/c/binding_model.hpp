#pragma once
// BindingModel: DistributedDataParallel over a binding's parameters, whose forward the binding
// runs itself: the C ABI calls begin_forward before it and end_forward with its outputs, the two
// halves of what DistributedDataParallel<M>::forward does around a C++ module's forward.

#include <memory>
#include <string>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/reducer/no_sync_guard.hpp"

namespace ddp::c_abi {

class BindingModel : public parallel::DistributedDataParallelBase {
 public:
  // The forward's two halves, each checked against the other (their order is the binding's).
  enum class Phase { kIdle, kInForward };

  BindingModel(std::shared_ptr<torch::nn::Module> tree, comm::ProcessGroupPtr group,
               parallel::DDPOptions options)
      : DistributedDataParallelBase(std::move(tree), std::move(group), std::move(options)) {}

  void begin_forward() {
    pre_forward();
    phase_ = Phase::kInForward;
  }
  void end_forward(const std::vector<torch::Tensor>& outputs) {
    phase_ = Phase::kIdle;
    post_forward(outputs);
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
