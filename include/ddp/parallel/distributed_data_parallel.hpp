#pragma once
// DistributedDataParallel: wraps any torch::nn::Module; forward keeps the module's own signature.
// Construction verifies that every rank holds the same model and broadcasts rank 0's parameters
// and buffers; every synchronized backward then averages gradients over the ranks, overlapped with
// backward compute (see gradients/gradient_runtime.hpp).
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
#include "ddp/intake/module_call.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/wrap/evaluation.hpp"
#include "ddp/wrap/typed_module.hpp"
#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::parallel {

class DistributedDataParallelBase;

namespace detail {
// Internal: the gradient runtime behind `model` (its bucket storage), for the library's own tests;
// not part of the public API (docs/api.md): the public class answers with public types only.
gradients::GradientRuntime& gradients_of(DistributedDataParallelBase& model);
}  // namespace detail

class DistributedDataParallelBase : public wrap::WrappedModel {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                              comm::ProcessGroupPtr process_group, DDPOptions options);
  ~DistributedDataParallelBase() override;

  // The distinct parameters that require grad (tied weights appear once), registration order.
  const std::vector<torch::Tensor>& parameters() const;
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  std::string bucket_table() const;
  // How often the bucket plan changed (graph planning, the rebuild after iteration 1).
  int64_t num_plan_changes() const;
  comm::ProcessGroup& process_group() { return *group(); }
  const DDPOptions& options() const { return options_; }

  // Uneven inputs: runs `train_loop` (this rank's loop over its batches); a rank whose loop ends
  // first keeps shadowing the collectives of the ranks still training, until every rank is done.
  // Then all ranks take the state of the rank that trained longest (highest rank on ties).
  void join(const std::function<void()>& train_loop, JoinOptions options = {});

  // WrappedModel: whole on every rank (no parameter named in the layouts), nothing to reshard;
  // the bucket plan is the plan.
  const layout::TensorLayouts& layouts() const override { return layouts_; }
  void reshard() override {}
  std::string plan_summary() const override;
  std::string plan_table() const override { return bucket_table(); }

 protected:
  void pre_forward() override;
  void end_forward(const std::vector<torch::Tensor>& outputs) override;
  std::vector<std::pair<std::string, std::string>> describe_options() const override;

 private:
  friend gradients::GradientRuntime& detail::gradients_of(DistributedDataParallelBase& model);

  void begin_evaluation() override;
  // DDPOptions::check_replicas_every: compares every kept tensor's checksum with rank 0's.
  void check_replicas();

  DDPOptions options_;
  layout::TensorLayouts layouts_;  // replicated over {world}: no parameter named
  std::vector<std::string> param_names_;
  std::vector<torch::Tensor> all_params_;  // every distinct parameter not ignored (broadcast set)
  std::vector<std::string> all_param_names_;  // their first names
  std::vector<std::string> buffer_names_;
  // Join state: inside join(), every synchronized forward first all-reduces "still training".
  bool joining_ = false;
  JoinOptions join_options_;
  int64_t iterations_ = 0;        // synchronized forwards on this rank (join picks the longest)
  int64_t checked_forwards_ = 0;  // synchronized training forwards, for check_replicas_every
};

template <typename ModuleType>
class DistributedDataParallel
    : public DistributedDataParallelBase,
      public wrap::TypedModule<ModuleType, DistributedDataParallel<ModuleType>> {
 public:
  DistributedDataParallel(ModuleType module, comm::ProcessGroupPtr process_group,
                          DDPOptions options = {})
      : DistributedDataParallelBase(intake::as_module_ptr(module), std::move(process_group),
                                    options),
        wrap::TypedModule<ModuleType, DistributedDataParallel>(module) {}

  // The runtime of the forward protocol (wrap/typed_module.hpp): this wrapper itself.
  wrap::WrappedModel& wrapped() { return *this; }
};

}  // namespace ddp::parallel

namespace ddp {
using parallel::DDPOptions;
using parallel::DistributedDataParallel;
}  // namespace ddp
