#include "ddp/parallel/distributed_data_parallel.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/embedding.h>

#include <map>
#include <set>
#include <unordered_set>

#include "ddp/buckets/bucket_table.hpp"
#include "ddp/comm/broadcast_coalesced.hpp"
#include "ddp/comm/control_scalars.hpp"
#include "ddp/obs/log.hpp"
#include "ddp/obs/timeline.hpp"
#include "ddp/planner/reachability.hpp"
#include "ddp/planner/ready_order.hpp"
#include "ddp/unit/module_intake.hpp"

namespace ddp::parallel {

namespace {

// Parameters whose module produces sparse gradients (Embedding / EmbeddingBag with sparse=true).
std::unordered_set<const c10::TensorImpl*> sparse_gradient_params(torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> out;
  for (const auto& m : module.modules()) {
    if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(m.get())) {
      if (e->options.sparse()) out.insert(e->weight.unsafeGetTensorImpl());
    } else if (auto* b = dynamic_cast<torch::nn::EmbeddingBagImpl*>(m.get())) {
      if (b->options.sparse()) out.insert(b->weight.unsafeGetTensorImpl());
    }
  }
  return out;
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         comm::ProcessGroupPtr process_group,
                                                         DDPOptions options)
    : module_(std::move(module)), pg_(std::move(process_group)), options_(std::move(options)) {
  TORCH_CHECK(module_, "ddp: DistributedDataParallel needs a module");
  TORCH_CHECK(pg_, "ddp: DistributedDataParallel needs a process group");
  TORCH_CHECK(options_.stats_every >= 1, "ddp: DDPOptions::stats_every must be at least 1, got ",
              options_.stats_every);
  // Tied weights once (the first name wins, the tensor is reduced once), frozen parameters in the
  // replica and the broadcast but not the reducer, buffers broadcast: unit/module_intake.hpp.
  const unit::ModuleIntake intake = unit::take_in(*module_, options_.params_to_ignore);
  all_params_ = intake.params;
  buffers_ = intake.buffers;
  buffer_names_ = intake.buffer_names;
  param_names_ = intake.trainable_names();
  const std::vector<torch::Tensor> grad_params = intake.trainable_params();
  const auto sparse = sparse_gradient_params(*module_);
  std::vector<bool> expect_sparse;
  for (const auto& p : grad_params) {
    expect_sparse.push_back(sparse.count(p.unsafeGetTensorImpl()) > 0);
  }
  unit::synchronize_replicas(*pg_, intake, "DistributedDataParallel");

  reducer_ = std::make_unique<reducer::GradientRuntime>(
      pg_, std::vector<reducer::ReduceUnit>{}, nullptr,
      reducer::ReplicaParams{grad_params, param_names_, options_.reducer, expect_sparse});
  stats_ = std::make_unique<obs::GradientStats>(options_.stats_every);
  reducer_->add_listener(stats_->listener(), "the stats timeline");
  const bool show =
      pg_->rank() == 0 && (options_.verbose || obs::log_level() >= obs::LogLevel::kInfo);
  if (show) {
    obs::log(obs::LogLevel::kError, pg_->rank(), bucket_table());
    const int rank = pg_->rank();
    reducer_->on_plan_change([rank](const std::string& table) {
      obs::log(obs::LogLevel::kError, rank, "bucket plan changed:\n" + table);
    });
  }
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;

reducer::GradientRuntime& detail::reducer_of(DistributedDataParallelBase& model) {
  return *model.reducer_;
}

int64_t DistributedDataParallelBase::num_plan_changes() const {
  return reducer_->num_plan_changes();
}

int64_t DistributedDataParallelBase::num_synchronized_backwards() const {
  return reducer_->num_synchronized_backwards();
}

std::string DistributedDataParallelBase::bucket_table() const { return reducer_->bucket_table(); }

void DistributedDataParallelBase::sync_buffers() {
  comm::broadcast_coalesced(*pg_, buffers_, 0, "broadcast of rank 0's buffers");
}

void DistributedDataParallelBase::register_comm_hook(hooks::CommHookPtr hook) {
  reducer_->register_comm_hook(std::move(hook));
}

void DistributedDataParallelBase::set_optimizer_in_backward(
    const optim::ParamOptimizerFactory& factory) {
  TORCH_CHECK(!reducer_->backward_ran(),
              "ddp: set_optimizer_in_backward must be called before the first backward");
  TORCH_CHECK(!optimizer_in_backward_, "ddp: the optimizer in backward is already set");
  auto listener = std::make_unique<optim::OptimizerInBackward>(reducer_->params(), factory);
  reducer_->add_listener(listener.get(), "set_optimizer_in_backward");
  optimizer_in_backward_ = std::move(listener);
}

void DistributedDataParallelBase::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& p : reducer_->params()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void DistributedDataParallelBase::pre_forward() {
  stats_->collect(reducer_->num_synchronized_backwards());
  stats_->forward_started();
  if (!torch::GradMode::is_enabled()) return;  // inference: nothing to synchronize
  reducer_->follow_current_stream();
  if (joining_) {
    TORCH_CHECK(require_sync_, "ddp: no_sync() inside join() is not supported");
    // Ranks still training say 1, joined ranks 0: the sum is the divisor's candidate.
    at::Tensor active = comm::control_tensor(*pg_, {1}, at::kInt);
    pg_->allreduce_sum(active, "join: all-reduce of the active-rank count");
    const int64_t n = comm::read_scalar(active);
    if (!join_options_.divide_by_initial_world_size) reducer_->set_divisor_for_next_backward(n);
  }
  if (options_.broadcast_buffers && require_sync_) sync_buffers();
}

void DistributedDataParallelBase::post_forward(const std::vector<torch::Tensor>& outputs) {
  if (!torch::GradMode::is_enabled()) return;  // inference: no backward will follow
  if (!require_sync_) {
    reducer_->prepare_for_local_backward();
    return;
  }
  const bool walk = options_.reducer.find_unused_parameters || options_.reducer.static_graph ||
                    (options_.graph_planning && reducer_->awaiting_plan());
  TORCH_CHECK(!walk || !outputs.empty(),
              "ddp: find_unused_parameters, static_graph and graph planning need the forward to "
              "return tensors (a Tensor, a vector, pair or tuple of them) to walk the graph from");
  if (options_.graph_planning && reducer_->awaiting_plan()) {
    reducer_->set_predicted_order(planner::predict_ready_order(outputs, reducer_->params()));
  }
  reducer_->prepare_for_backward(reducer_->needs_walk()
                                     ? planner::reachable_params(outputs, reducer_->params())
                                     : std::vector<bool>{});
  stats_->forward_ended();
  ++iterations_;
}

obs::LoggingData DistributedDataParallelBase::logging_data() {
  stats_->collect(reducer_->num_synchronized_backwards());
  obs::LoggingData d;
  d.rank = pg_->rank();
  d.world_size = pg_->world_size();
  d.backend = pg_->backend_name();
  d.comm_hook = reducer_->comm_hook_name();
  for (const auto& [name, value] : describe(options_)) d.options[name] = value;
  for (const auto& b : reducer_->plan().buckets) {
    d.bucket_sizes.push_back(b.bytes);
    d.bucket_reductions.push_back(b.reduction);
  }
  d.param_names = param_names_;
  d.iterations = reducer_->num_synchronized_backwards();
  stats_->fill(d);
  return d;
}

void DistributedDataParallelBase::join(const std::function<void()>& train_loop,
                                       JoinOptions options) {
  TORCH_CHECK(!joining_, "ddp: join() calls cannot be nested");
  joining_ = true;
  join_options_ = options;
  const int64_t start_iterations = iterations_;
  try {
    train_loop();
  } catch (...) {
    joining_ = false;
    throw;
  }
  joining_ = false;
  // Shadow the ranks still training: each of their iterations is [active count, buffers, used
  // map, buckets]; we answer with 0 and zeros until the count is 0 everywhere.
  while (true) {
    at::Tensor active = comm::control_tensor(*pg_, {0}, at::kInt);
    pg_->allreduce_sum(active, "join: all-reduce of the active-rank count");
    if (comm::read_scalar(active) == 0) break;
    if (options_.broadcast_buffers) sync_buffers();
    reducer_->shadow_backward();
  }
  // The rank that trained longest holds the final state (its optimizer saw every step).
  const at::Tensor mine = comm::control_tensor(*pg_, {iterations_ - start_iterations});
  const auto counts = pg_->all_gather_each(mine, "join: all-gather of iteration counts");
  int authority = 0;
  int64_t best = -1;
  for (int r = 0; r < pg_->world_size(); ++r) {
    const int64_t c = comm::read_scalar(counts[static_cast<size_t>(r)]);
    if (c >= best) {
      best = c;
      authority = r;
    }
  }
  std::vector<torch::Tensor> state = all_params_;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  comm::broadcast_coalesced(*pg_, state, authority, "join: broadcast of the final state");
}

}  // namespace ddp::parallel
