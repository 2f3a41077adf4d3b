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
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/gradients/gradient_runtime.hpp"
#include "ddp/intake/module_intake.hpp"
#include "ddp/intake/replica_check.hpp"
#include "ddp/obs/log.hpp"
#include "ddp/obs/timeline.hpp"
#include "ddp/planner/reachability.hpp"
#include "ddp/planner/ready_order.hpp"

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
    : WrappedModel(std::move(module), std::move(process_group), options.stats_every,
                   "DistributedDataParallel"),
      options_(std::move(options)),
      layouts_(layout::replicated_over({group()->world_size()}, {group()->rank()})) {
  // Tied weights once (the first name wins, the tensor is reduced once), frozen parameters in the
  // replica and the broadcast but not the reducer, buffers broadcast: intake/module_intake.hpp.
  const intake::ModuleIntake intake = intake::take_in(*module_ptr(), options_.params_to_ignore);
  all_params_ = intake.params;
  all_param_names_ = intake.names;
  set_buffers(intake.buffers);
  buffer_names_ = intake.buffer_names;
  param_names_ = intake.trainable_names();
  const std::vector<torch::Tensor> grad_params = intake.trainable_params();
  const auto sparse = sparse_gradient_params(*module_ptr());
  std::vector<bool> expect_sparse;
  for (const auto& p : grad_params) {
    expect_sparse.push_back(sparse.count(p.unsafeGetTensorImpl()) > 0);
  }
  intake::synchronize_replicas(*group(), intake, "DistributedDataParallel");

  set_gradients(std::make_unique<gradients::GradientRuntime>(
      group(), std::vector<gradients::ReduceUnit>{}, nullptr,
      gradients::ReplicaParams{grad_params, param_names_, options_.gradients, expect_sparse}));
  const int rank = group()->rank();
  if (rank == 0 && (options_.verbose || obs::log_level() >= obs::LogLevel::kInfo)) {
    obs::log(obs::LogLevel::kError, rank, bucket_table());
    gradients()->on_plan_change([rank](const std::string& table) {
      obs::log(obs::LogLevel::kError, rank, "bucket plan changed:\n" + table);
    });
  }
}

DistributedDataParallelBase::~DistributedDataParallelBase() { drop_gradients(); }

gradients::GradientRuntime& detail::gradients_of(DistributedDataParallelBase& model) {
  return *model.gradients();
}

const std::vector<torch::Tensor>& DistributedDataParallelBase::parameters() const {
  return gradients()->params();
}

int64_t DistributedDataParallelBase::num_plan_changes() const {
  return gradients()->num_plan_changes();
}

std::string DistributedDataParallelBase::bucket_table() const {
  return gradients()->bucket_table();
}

std::string DistributedDataParallelBase::plan_summary() const {
  const size_t n = bucket_plan().buckets.size();
  return std::to_string(n) + (n == 1 ? " bucket" : " buckets");
}

std::vector<std::pair<std::string, std::string>> DistributedDataParallelBase::describe_options()
    const {
  return describe(options_);
}

void DistributedDataParallelBase::begin_evaluation() {
  // The parameters are whole already; the buffers become rank 0's, as an evaluation forward's.
  if (options_.broadcast_buffers) sync_buffers_for(ForwardKind::kEvaluationScope);
}

void DistributedDataParallelBase::pre_forward() {
  stats().collect(num_synchronized_backwards());
  stats().forward_started();
  if (!torch::GradMode::is_enabled()) {
    // An evaluation's forward (no_grad): nothing of the gradients to prepare, but rank 0's buffers
    // still come first, as PyTorch's DDP does, so every rank evaluates with the same BatchNorm
    // statistics (they drift apart within a step: each rank's batch moves its own).
    if (options_.broadcast_buffers && require_sync()) sync_buffers_for(ForwardKind::kEvaluation);
    return;
  }
  gradients::GradientRuntime& runtime = *gradients();
  runtime.follow_current_stream();
  if (joining_) {
    TORCH_CHECK(require_sync(), "ddp: no_sync() inside join() is not supported");
    // Ranks still training say 1, joined ranks 0: the sum is the divisor's candidate.
    at::Tensor active = comm::control_tensor(*group(), {1}, at::kInt);
    const comm::ForPurpose purpose({comm::Purpose::kControl});
    group()->allreduce_sum(active, "join: all-reduce of the active-rank count");
    const int64_t n = comm::read_scalar(active);
    if (!join_options_.divide_by_initial_world_size) runtime.set_divisor_for_next_backward(n);
  }
  if (options_.broadcast_buffers && require_sync()) sync_buffers();
  if (options_.check_replicas_every > 0 && require_sync() &&
      ++checked_forwards_ % options_.check_replicas_every == 0) {
    check_replicas();
  }
}

void DistributedDataParallelBase::check_replicas() {
  // After the buffer broadcast: the buffers then agree unless a rank broke them, and without the
  // broadcast they may differ by design, so only the parameters are compared.
  std::vector<at::Tensor> tensors = all_params_;
  std::vector<std::string> names = all_param_names_;
  if (options_.broadcast_buffers) {
    tensors.insert(tensors.end(), buffers().begin(), buffers().end());
    names.insert(names.end(), buffer_names_.begin(), buffer_names_.end());
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  sums.reserve(tensors.size());
  for (const at::Tensor& t : tensors) sums.push_back(intake::checksum(t));
  const std::string when =
      "replica check at synchronized forward " + std::to_string(checked_forwards_);
  std::vector<int64_t> counts;
  {
    const comm::ForPurpose purpose({comm::Purpose::kCheck});
    counts = intake::ranks_differing_from_rank0(*group(), sums, "DistributedDataParallel: " + when);
  }
  int64_t differing = 0;
  size_t first = counts.size();
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    if (first == counts.size()) first = i;
    ++differing;
  }
  TORCH_CHECK(first == counts.size(), "ddp: DistributedDataParallel: ", when, ": ",
              first < all_params_.size() ? "parameter '" : "buffer '", names[first],
              "' differs from rank 0's on ", counts[first], " rank(s) (", differing, " of ",
              counts.size(),
              " tensors differ): the replicas drifted apart; every rank must make the same "
              "optimizer steps on the same gradients (a rank that skipped optimizer.step(), or "
              "changed its parameters alone)");
}

void DistributedDataParallelBase::end_forward(const std::vector<torch::Tensor>& outputs) {
  if (!torch::GradMode::is_enabled()) return;  // inference: no backward will follow
  gradients::GradientRuntime& runtime = *gradients();
  if (!require_sync()) {
    runtime.prepare_for_local_backward();
    return;
  }
  const bool walk = options_.gradients.find_unused_parameters || options_.gradients.static_graph ||
                    (options_.graph_planning && runtime.awaiting_plan());
  TORCH_CHECK(!walk || !outputs.empty(),
              "ddp: find_unused_parameters, static_graph and graph planning need the forward to "
              "return tensors (a Tensor, a vector, pair or tuple of them) to walk the graph from");
  if (options_.graph_planning && runtime.awaiting_plan()) {
    runtime.set_predicted_order(planner::predict_ready_order(outputs, runtime.params()));
  }
  runtime.prepare_for_backward(runtime.needs_walk()
                                   ? planner::reachable_params(outputs, runtime.params())
                                   : std::vector<bool>{});
  stats().forward_ended();
  ++iterations_;
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
    at::Tensor active = comm::control_tensor(*group(), {0}, at::kInt);
    const comm::ForPurpose purpose({comm::Purpose::kControl});
    group()->allreduce_sum(active, "join: all-reduce of the active-rank count");
    if (comm::read_scalar(active) == 0) break;
    if (options_.broadcast_buffers) sync_buffers();
    gradients()->shadow_backward();
  }
  // The rank that trained longest holds the final state (its optimizer saw every step).
  const at::Tensor mine = comm::control_tensor(*group(), {iterations_ - start_iterations});
  const auto counts = [&] {
    const comm::ForPurpose purpose({comm::Purpose::kControl});
    return group()->all_gather_each(mine, "join: all-gather of iteration counts");
  }();
  int authority = 0;
  int64_t best = -1;
  for (int r = 0; r < group()->world_size(); ++r) {
    const int64_t c = comm::read_scalar(counts[static_cast<size_t>(r)]);
    if (c >= best) {
      best = c;
      authority = r;
    }
  }
  std::vector<torch::Tensor> state = all_params_;
  state.insert(state.end(), buffers().begin(), buffers().end());
  comm::broadcast_coalesced(*group(), state, authority, "join: broadcast of the final state");
}

}  // namespace ddp::parallel
