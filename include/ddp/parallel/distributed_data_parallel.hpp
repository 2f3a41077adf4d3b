#pragma once
// DistributedDataParallel: wraps any torch::nn::Module; forward keeps the module's own signature.
// Construction verifies that every rank holds the same model and broadcasts rank 0's parameters
// and buffers; every synchronized backward then averages gradients over the ranks, overlapped with
// backward compute (see reducer/gradient_runtime.hpp).
//
//   auto pg = ddp::comm::init_process_group();          // RANK, WORLD_SIZE, ... from the env
//   ddp::DistributedDataParallel<Net> model(Net(), pg);
//   auto loss = torch::mse_loss(model(x), y);           // Net::forward's signature
//   loss.backward();                                    // grads averaged over ranks here
//   { auto guard = model.no_sync(); model(x2).sum().backward(); }  // local accumulation

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/obs/gradient_stats.hpp"
#include "ddp/obs/runtime_stats.hpp"
#include "ddp/optim/optimizer_in_backward.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/reducer/gradient_runtime.hpp"
#include "ddp/reducer/no_sync_guard.hpp"
#include "ddp/unit/module_call.hpp"

namespace ddp::parallel {

class DistributedDataParallelBase;

namespace detail {
// Internal: the gradient runtime behind `model` (its bucket storage), for the library's own tests;
// not part of the public API (docs/api.md): the public class answers with public types only.
reducer::GradientRuntime& reducer_of(DistributedDataParallelBase& model);
}  // namespace detail

class DistributedDataParallelBase {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                              comm::ProcessGroupPtr process_group, DDPOptions options);
  virtual ~DistributedDataParallelBase();

  // Scoped: forwards and backwards inside accumulate gradients locally, with no communication; the
  // next synchronized backward reduces the accumulated sum.
  using NoSyncGuard = reducer::NoSyncGuard;
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(require_sync_); }

  // The distinct parameters that require grad (tied weights appear once), registration order.
  const std::vector<torch::Tensor>& parameters() const { return reducer_->params(); }
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  // The bucket plan (a plain, pure plan: buckets/bucket_plan.hpp) and its table.
  const buckets::BucketPlan& bucket_plan() const { return reducer_->plan(); }
  std::string bucket_table() const;
  // How often the bucket plan changed (graph planning, the rebuild after iteration 1).
  int64_t num_plan_changes() const;
  // Synchronized backward passes completed so far.
  int64_t num_synchronized_backwards() const;
  comm::ProcessGroup& process_group() { return *pg_; }
  const comm::ProcessGroupPtr& group() const { return pg_; }
  const DDPOptions& options() const { return options_; }
  std::shared_ptr<torch::nn::Module> module_ptr() const { return module_; }

  // Broadcasts rank 0's buffers to every rank (done before each synchronized forward when
  // DDPOptions::broadcast_buffers is set).
  void sync_buffers();

  // Replaces the built-in average (hooks/default_hooks.hpp, hooks/powersgd_hook.hpp, or your own).
  // Once, before the first backward.
  void register_comm_hook(hooks::CommHookPtr hook);
  // Optimizer overlap: each parameter's optimizer steps as soon as its bucket is reduced, inside
  // backward. `factory` makes the optimizer of one parameter (e.g. SGD over {p}). Once, before the
  // first backward; then do not call step() on an optimizer of your own.
  void set_optimizer_in_backward(const optim::ParamOptimizerFactory& factory);
  // Zeroes every parameter's gradient in place (keeps bucket views).
  void zero_grad();

  // Uneven inputs: runs `train_loop` (this rank's loop over its batches); a rank whose loop ends
  // first keeps shadowing the collectives of the ranks still training, until every rank is done.
  // Then all ranks take the state of the rank that trained longest (highest rank on ties).
  void join(const std::function<void()>& train_loop, JoinOptions options = {});

  // Runtime stats and configuration (PyTorch's _get_ddp_logging_data).
  obs::LoggingData logging_data();
  // The last synchronized backward's timeline (gradient-ready, launch and finish times).
  obs::IterationTimeline last_timeline() const { return stats_->last_timeline(); }

 protected:
  void pre_forward();
  void post_forward(const std::vector<torch::Tensor>& outputs);

 private:
  friend reducer::GradientRuntime& detail::reducer_of(DistributedDataParallelBase& model);

  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroupPtr pg_;
  DDPOptions options_;
  std::vector<std::string> param_names_;
  std::vector<torch::Tensor> all_params_;  // every distinct parameter not ignored (broadcast set)
  std::vector<torch::Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  // Listeners on the reducer's events; declared before reducer_ so they outlive it.
  std::unique_ptr<obs::GradientStats> stats_;
  std::unique_ptr<optim::OptimizerInBackward> optimizer_in_backward_;
  std::unique_ptr<reducer::GradientRuntime> reducer_;
  bool require_sync_ = true;  // false inside no_sync()
  // Join state: inside join(), every synchronized forward first all-reduces "still training".
  bool joining_ = false;
  JoinOptions join_options_;
  int64_t iterations_ = 0;  // synchronized forwards on this rank (join picks the longest)
};

template <typename ModuleType>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(ModuleType module, comm::ProcessGroupPtr process_group,
                          DDPOptions options = {})
      : DistributedDataParallelBase(unit::as_module_ptr(module), std::move(process_group), options),
        module_(std::move(module)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    pre_forward();
    auto output = unit::call_forward(module_, std::forward<Args>(args)...);
    std::vector<torch::Tensor> tensors;
    unit::collect(output, tensors);
    post_forward(tensors);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  ModuleType& module() { return module_; }

 private:
  ModuleType module_;
};

}  // namespace ddp::parallel

namespace ddp {
using parallel::DDPOptions;
using parallel::DistributedDataParallel;
}  // namespace ddp
