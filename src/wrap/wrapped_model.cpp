#include "ddp/wrap/wrapped_model.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "ddp/comm/broadcast_coalesced.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/gradients/gradient_runtime.hpp"
#include "ddp/nn/sync_batch_norm.hpp"

namespace ddp::wrap {

namespace {

int64_t checked_stats_every(int64_t every, const char* wrapper) {
  TORCH_CHECK(every >= 1, "ddp: ", wrapper, ": stats_every must be at least 1, got ", every);
  return every;
}

}  // namespace

WrappedModel::WrappedModel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr group,
                           int64_t stats_every, const char* wrapper)
    : module_(std::move(module)),
      pg_(std::move(group)),
      stats_(checked_stats_every(stats_every, wrapper)) {
  TORCH_CHECK(module_, "ddp: ", wrapper, " needs a module");
  TORCH_CHECK(pg_, "ddp: ", wrapper, " needs a process group");
  // Every SyncBatchNorm of the model combines the batches of this wrapper's ranks, unless bound
  // to another group by hand first (nn/sync_batch_norm.hpp).
  nn::bind_sync_batch_norms(*module_, pg_, /*only_unbound=*/true);
}

WrappedModel::~WrappedModel() = default;

namespace {

const char* kind_text(int kind) {
  switch (kind) {
    case 1:
      return "a training forward";
    case 2:
      return "an evaluation forward (no_grad)";
    case 3:
      return "model.evaluation()";
    default:
      return "an unknown forward";
  }
}

}  // namespace

// [Note: the forward's kind] A forward made by some ranks only (rank 0 evaluates alone) pairs its
// collectives with the other ranks' next ones: the buffer broadcasts match, the gathers or
// reductions that follow do not, and Gloo then aborts the process on the size mismatch
// ("terminate called after throwing gloo::EnforceNotMet"), with no word of ours. So rank 0's kind
// of forward travels in the buffer broadcast that starts it (one more element of the first
// buffer's dtype: the same flat collective), and a rank that made another kind stops there, naming
// both. On a CPU group only, where reading it back costs nothing; under NCCL such a mismatch hangs
// in the next collective and the watchdog names it.
void WrappedModel::sync_buffers_for(ForwardKind kind) {
  const comm::CollectivePurpose what{comm::Purpose::kBufferBroadcast};
  const comm::ForPurpose purpose(what);
  std::vector<at::Tensor> tensors = buffers_;
  at::Tensor header;
  if (!buffers_.empty() && pg_->world_size() > 1 && pg_->device().is_cpu() &&
      buffers_[0].scalar_type() != at::kBool) {
    header = at::full({1}, static_cast<int>(kind), buffers_[0].options());
    tensors.push_back(header);
  }
  comm::broadcast_coalesced(*pg_, tensors, 0, "broadcast of " + what.describe());
  if (!header.defined() || pg_->rank() == 0) return;
  const int theirs = static_cast<int>(header.item<double>());
  TORCH_CHECK(theirs == static_cast<int>(kind), "ddp: rank 0 made ", kind_text(theirs),
              " where rank ", pg_->rank(), " made ", kind_text(static_cast<int>(kind)),
              ": every rank of the group must make every forward through the wrapper and open "
              "every model.evaluation() together (under DDP, evaluate on one rank alone by "
              "calling the module itself, which communicates nothing)");
}

void WrappedModel::set_gradients(std::unique_ptr<gradients::GradientRuntime> gradients) {
  TORCH_CHECK(!gradients_, "ddp: the gradient runtime is set once");
  gradients_ = std::move(gradients);
  if (gradients_) gradients_->add_listener(stats_.listener(), "the stats timeline");
}

void WrappedModel::drop_gradients() {
  optimizer_in_backward_.reset();
  gradients_.reset();
}

void WrappedModel::register_comm_hook(hooks::CommHookPtr hook) {
  TORCH_CHECK(gradients_, "ddp: register_comm_hook: the module has no parameter to reduce");
  gradients_->register_comm_hook(std::move(hook));
}

void WrappedModel::set_optimizer_in_backward(const optim::ParamOptimizerFactory& factory) {
  TORCH_CHECK(!optimizer_in_backward_, "ddp: the optimizer in backward is already set");
  if (!gradients_) return;  // nothing is reduced, so nothing steps inside backward
  TORCH_CHECK(!gradients_->backward_ran(),
              "ddp: set_optimizer_in_backward must be called before the first backward");
  auto listener = std::make_unique<optim::OptimizerInBackward>(gradients_->params(), factory);
  gradients_->add_listener(listener.get(), "set_optimizer_in_backward");
  optimizer_in_backward_ = std::move(listener);
}

void WrappedModel::zero_grad() {
  if (!gradients_) return;
  gradients_->require_not_in_backward("zero_grad()");
  torch::NoGradGuard no_grad;
  for (at::Tensor p : gradients_->params()) {  // a handle: its gradient is the parameter's
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

obs::LoggingData WrappedModel::logging_data() {
  const int64_t done = num_synchronized_backwards();
  stats_.collect(done);
  obs::LoggingData d;
  d.rank = pg_->rank();
  d.world_size = pg_->world_size();
  d.backend = pg_->backend_name();
  d.comm_hook = gradients_ ? gradients_->comm_hook_name() : "none";
  for (const auto& [name, value] : describe_options()) d.options[name] = value;
  for (const auto& b : bucket_plan().buckets) {
    d.bucket_sizes.push_back(b.bytes);
    d.bucket_reductions.push_back(b.reduction);
  }
  if (gradients_) d.param_names = gradients_->names();
  d.iterations = done;
  stats_.fill(d);
  return d;
}

comm::Sharding WrappedModel::sharding() const { return {layouts(), {group()}, group()}; }

obs::IterationTimeline WrappedModel::last_timeline() const { return stats_.last_timeline(); }

const buckets::BucketPlan& WrappedModel::bucket_plan() const {
  static const buckets::BucketPlan kNone;
  return gradients_ ? gradients_->plan() : kNone;
}

int64_t WrappedModel::num_synchronized_backwards() const {
  return gradients_ ? gradients_->num_synchronized_backwards() : 0;
}

}  // namespace ddp::wrap
