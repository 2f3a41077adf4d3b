#include "ddp/gradients/replica_buckets.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "ddp/comm/control_scalars.hpp"
#include "ddp/detail/capture_status.hpp"

namespace ddp::gradients {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  return out.str();
}

}  // namespace

ReplicaBuckets::ReplicaBuckets(ReplicaParams replicas, comm::ProcessGroupPtr pg,
                               std::function<void(size_t)> on_ready,
                               const std::vector<GradientListener*>& listeners)
    : ReduceStrategy(listeners),
      params_(std::move(replicas.params)),
      names_(std::move(replicas.names)),
      pg_(std::move(pg)),
      options_(replicas.options),
      in_place_(options_.reduce_in_place.value_or(pg_->backend_traits().waits_on_stream)) {
  TORCH_CHECK(params_.size() == names_.size(), "ddp: ", params_.size(), " parameters but ",
              names_.size(), " names");
  const std::vector<bool>& expect_sparse = replicas.expect_sparse;
  TORCH_CHECK(expect_sparse.empty() || expect_sparse.size() == params_.size(),
              "ddp: expect_sparse has ", expect_sparse.size(), " entries for ", params_.size(),
              " parameters");
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    TORCH_CHECK(p.requires_grad() && p.is_leaf(), "ddp: parameter '", names_[i],
                "' must be a leaf that requires grad");
    const bool sparse = !expect_sparse.empty() && expect_sparse[i];
    specs_.push_back({names_[i], p.numel(), p.scalar_type(), p.device(), sparse});
  }
  ready_.assign(params_.size(), false);
  saved_unused_grads_.resize(params_.size());
  const bool on_device = !params_.empty() && params_[0].is_cuda();
  unused_ = UnusedParams(params_.size(),
                         params_.empty() ? at::TensorOptions() : params_[0].options(), on_device);
  build_plan(buckets::reverse_registration_order(params_.size()));
  autograd_hooks_ = std::make_unique<AutogradHooks>(params_, names_, std::move(on_ready));
}

ReplicaBuckets::~ReplicaBuckets() = default;

void ReplicaBuckets::make_runtime(const hooks::CommHookPtr& hook, int64_t plan_epoch) {
  runtime_.reset();
  runtime_ = std::make_unique<BucketRuntime>(params_, plan_, *storage_, pg_, hook, plan_epoch,
                                             events_.first_bucket());
}

bool ReplicaBuckets::build_plan(const std::vector<size_t>& order) {
  if (storage_ && order == plan_order_) return false;
  buckets::PlanOptions plan_options = options_.buckets;
  plan_options.order = order;
  buckets::BucketPlan plan = buckets::plan_buckets(specs_, plan_options);
  buckets::BucketStorageOptions storage_options;
  storage_options.reduce_staged_in_place = in_place_;
  auto storage = std::make_unique<buckets::BucketStorage>(plan, params_, storage_options);
  // A gradient a parameter already holds (from before, or in an old bucket) moves into the new
  // bucket, so nothing accumulated is lost. Reduced in place, gradients are tensors of their own
  // and stay where they are (the new buckets are allocated only when first needed).
  if (options_.gradient_as_bucket_view && !in_place_) {
    for (size_t p = 0; p < params_.size(); ++p) storage->adopt(p, params_[p].mutable_grad(), true);
  }
  runtime_.reset();  // refers to the old plan and storage
  plan_ = std::move(plan);
  plan_order_ = order;
  storage_ = std::move(storage);
  return true;
}

std::vector<size_t> ReplicaBuckets::agree_on_order(std::vector<size_t> order,
                                                   const std::string& what) {
  // Rank 0's order wins: data-dependent control flow could make ranks see different orders,
  // and buckets must be identical everywhere.
  if (pg_->world_size() == 1 || order.empty()) return order;
  at::Tensor t = comm::control_tensor(*pg_, std::vector<int64_t>(order.begin(), order.end()));
  pg_->broadcast(t, 0, what);
  const std::vector<int64_t> agreed = comm::read_scalars(t);
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<size_t>(agreed[i]);
  return order;
}

std::optional<bool> ReplicaBuckets::set_predicted_order(const std::vector<size_t>& predicted) {
  TORCH_CHECK(!planned_, "ddp: the predicted order must be set before the first backward");
  planned_ = true;
  rebuilt_ = true;  // predicted from the graph: no rebuild after iteration 1
  if (params_.empty()) return false;
  // Parameters missing from the prediction go last, in reverse registration order.
  return build_plan(agree_on_order(buckets::complete_order(predicted, params_.size()),
                                   "broadcast of the predicted bucket order"));
}

bool ReplicaBuckets::rebuild_once() {
  if (rebuilt_) return false;
  // No graph planning: the order just observed replaces reverse registration order, once. Rank
  // 0's order is broadcast so every rank builds the same buckets; parameters missing from it
  // (unused in that iteration) go last, in reverse registration order, as PyTorch's rebuild does.
  rebuilt_ = true;
  return build_plan(agree_on_order(buckets::complete_order(observed_order_, params_.size()),
                                   "broadcast of the observed bucket order"));
}

bool ReplicaBuckets::needs_walk(int64_t num_sync_backwards) const {
  return options_.find_unused_parameters || (options_.static_graph && num_sync_backwards == 0);
}

bool ReplicaBuckets::prepare(const std::vector<bool>& reachable,
                             const std::vector<size_t>& /*unit_order*/) {
  refuse_capture_if_host_bound();
  if (!reachable.empty()) {
    TORCH_CHECK(reachable.size() == params_.size(), "ddp: reachability for ", reachable.size(),
                " parameters, the reducer has ", params_.size());
    unused_.set_reachable(reachable);
  }
  planned_ = true;  // from now on only the post-iteration-1 rebuild may change the plan
  // Gradients staged by a backward that failed before its buckets launched are stale.
  storage_->drop_staged();
  return false;
}

void ReplicaBuckets::refuse_capture_if_host_bound() const {
  if (params_.empty() || !detail::is_capturing(params_[0].device())) return;
  // Both read a device value on the host or run a collective there every step: a graph replays
  // device work only, so the capture would fail with CUDA's "operation not permitted when stream
  // is capturing" or replay step 1's decision forever.
  TORCH_CHECK(!options_.find_unused_parameters || options_.static_graph,
              "ddp: DistributedDataParallel with find_unused_parameters cannot be captured in a "
              "CUDA graph: the used-parameter map is read on the host every step. Set "
              "static_graph too (the set recorded in the first step is replayed), or run eagerly");
  TORCH_CHECK(pg_->backend() != comm::Backend::kGloo,
              "ddp: DistributedDataParallel over gloo cannot be captured in a CUDA graph: Gloo's "
              "collectives run on the host; use nccl");
}

void ReplicaBuckets::start_backward(bool sync, int64_t num_sync_backwards) {
  if (!sync) return;  // a local backward only marks uses (gradient_ready)
  observed_order_.clear();
  runtime_->arm_synchronized(num_sync_backwards, divisor_);
  const bool first_iteration = num_sync_backwards == 0;
  const bool recorded = options_.static_graph && !first_iteration;
  const bool map = options_.find_unused_parameters || (options_.static_graph && first_iteration);
  // Every rank issues the map's collective at the same point (first gradient), before any bucket.
  const std::vector<bool> unused = unused_.find_unused(map, recorded, *pg_);
  for (size_t p = 0; p < params_.size(); ++p) {
    if (unused[p]) mark_ready(p, /*used=*/false);
  }
}

std::string ReplicaBuckets::gradient_without_forward(size_t index) const {
  return "ddp: a gradient for parameter '" + names_[index] +
         "' was computed, but no forward of the DistributedDataParallel module ran since the "
         "last backward. Each backward needs its own forward (backward twice through one graph, "
         "e.g. with retain_graph, is not supported).";
}

int64_t ReplicaBuckets::gradient_ready(size_t index, const at::Tensor& /*incoming*/,
                                       const GradientArrival& arrival) {
  if (!arrival.sync) {
    unused_.mark_local_use(index);
    return -1;
  }
  const int64_t num_sync_backwards = arrival.num_sync_backwards;
  if (options_.static_graph && num_sync_backwards > 0) {
    TORCH_CHECK(!unused_.static_unused(index), "ddp: static_graph is set, but parameter '",
                names_[index], "' got a gradient in iteration ", num_sync_backwards + 1,
                " although it was unused in the first iteration: the graph changed. Use "
                "find_unused_parameters instead of static_graph for a graph that changes.");
  }
  TORCH_CHECK(unused_.reachable(index), "ddp: parameter '", names_[index],
              "' got a gradient although the forward outputs do not depend on it; the loss must be "
              "computed from the outputs of the DistributedDataParallel module.");
  TORCH_CHECK(!ready_[index], "ddp: parameter '", names_[index],
              "' became ready twice in one backward. A parameter may take part in one "
              "synchronized backward per forward; reentrant backward is not supported.");
  observed_order_.push_back(index);
  mark_ready(index, /*used=*/true);
  if (arrival.early_finish) finish_buckets(/*only_completed=*/true);
  return -1;
}

void ReplicaBuckets::mark_ready(size_t index, bool used) {
  ready_[index] = true;
  events_.grad_ready(index, used);
  at::Tensor& grad = params_[index].mutable_grad();
  at::NoGradGuard no_grad;
  if (specs_[index].sparse) {
    TORCH_CHECK(!grad.defined() || grad.is_sparse(), "ddp: parameter '", names_[index],
                "' was declared sparse but its gradient is dense");
    if (!used) saved_unused_grads_[index] = grad.defined() ? grad.clone() : at::Tensor();
    runtime_->set_sparse_grad(
        plan_.bucket_of[index],
        grad.defined() ? grad.coalesce()
                       : at::zeros(params_[index].sizes(), params_[index].options()).to_sparse());
  } else {
    const at::Tensor& slot = storage_->slot(index);
    if (grad.defined()) {
      TORCH_CHECK(!grad.is_sparse(), "ddp: parameter '", names_[index],
                  "' has a sparse gradient, but its module did not declare sparse gradients "
                  "(torch::nn::Embedding with sparse(true) is detected)");
      if (!used) saved_unused_grads_[index] = grad.clone();
      // With bucket views the grad normally IS the slot. After zero_grad(set_to_none) the
      // accumulator made a fresh tensor: move it into the bucket and make the bucket the gradient
      // again. Without bucket views the gradient is always copied in.
      if (!storage_->holds(index, grad)) {
        // Copied at the bucket's launch with the rest of its bucket ([Note: staged copies]), or
        // reduced where it is ([Note: in-place reduction]; param.grad then stays this tensor,
        // and write_back points it at the slot only if the bucket was filled after all).
        storage_->stage(index, grad);
        if (options_.gradient_as_bucket_view && !in_place_) grad = slot;
      }
    } else {
      storage_->materialize(plan_.bucket_of[index]);  // lazy under in-place reduction
      at::Tensor target = storage_->slot(index);
      target.zero_();  // only an unused parameter can be here; it contributes zero
    }
  }
  if (options_.overlap) {
    const size_t count = runtime_->register_grad_ready(index);
    if (count > 0) events_.launched(runtime_->launched(), count);
  }
}

void ReplicaBuckets::finish_buckets(bool only_completed) {
  // Early finish (optimizer in backward): only buckets already reduced, in order, so no wait here
  // blocks the autograd thread; and only once the used map is known.
  if (only_completed && !unused_.map_ready()) return;
  while (runtime_->has_in_flight() && (!only_completed || runtime_->next_completed())) {
    write_back(runtime_->finish_next());
  }
}

void ReplicaBuckets::write_back(const BucketRuntime::Finished& finished) {
  const buckets::Bucket& spec = plan_.buckets[finished.bucket];
  unused_.wait(*pg_);
  at::NoGradGuard no_grad;
  for (size_t p : spec.params) {
    at::Tensor& grad = params_[p].mutable_grad();
    const at::Tensor& slot = storage_->slot(p);
    if (!unused_.globally_used(p, *pg_)) {
      // As PyTorch: a parameter no rank used keeps the gradient it had (undefined stays undefined).
      if (saved_unused_grads_[p].defined()) {
        if (spec.sparse) {
          grad = saved_unused_grads_[p];
        } else if (finished.in_place || storage_->holds(p, grad)) {
          grad.copy_(saved_unused_grads_[p]);
        }
      }
      continue;
    }
    if (finished.in_place) continue;  // param.grad is the tensor the average was written into
    if (spec.sparse) {
      grad = finished.sparse_result;
    } else if (options_.gradient_as_bucket_view) {
      if (!storage_->holds(p, grad)) grad = slot;
    } else if (grad.defined()) {
      grad.copy_(slot);
    } else {
      grad = slot.clone();
    }
  }
  events_.finished(finished.bucket, spec.params, finished.comm_done_ns);
}

void ReplicaBuckets::finish_backward(int64_t num_sync_backwards) {
  std::vector<std::string> missing;
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!ready_[p]) missing.push_back(names_[p]);
  }
  // Finish what was launched even on the error path: those collectives are already matched with
  // the other ranks' and must not be left half-done.
  std::exception_ptr failure;
  if (!options_.overlap) {  // every bucket now, in plan order (the runtime keeps it)
    size_t count = 0;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (ready_[p]) count += runtime_->register_grad_ready(p);
    }
    if (count > 0) events_.launched(runtime_->launched(), count);
  }
  while (runtime_->has_in_flight()) {
    try {
      write_back(runtime_->finish_next());
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (!failure) {
    try {
      unused_.wait(*pg_);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (missing.empty()) return;
  const bool graph_changed = options_.static_graph && num_sync_backwards > 0;
  TORCH_CHECK(!graph_changed, "ddp: static_graph is set, but ", missing.size(),
              " parameter(s) that had gradients in the first iteration got none in iteration ",
              num_sync_backwards + 1, ": ", join_names(missing),
              ". The graph changed; use find_unused_parameters instead of static_graph.");
  TORCH_CHECK(false, "ddp: ", missing.size(),
              " parameter(s) received no gradient in this backward: ", join_names(missing),
              ". Their buckets could not be reduced. If these parameters are not used in every "
              "forward, construct DistributedDataParallel with find_unused_parameters = true; "
              "if they never take part, set requires_grad to false or list them in "
              "params_to_ignore.");
}

void ReplicaBuckets::succeeded(int64_t num_sync_backwards) {
  if (options_.static_graph && num_sync_backwards == 0) unused_.record_static();
}

void ReplicaBuckets::reset() {
  divisor_ = 0;
  ready_.assign(params_.size(), false);
  for (auto& g : saved_unused_grads_) g.reset();
  if (runtime_) runtime_->reset();
  unused_.reset();
}

void ReplicaBuckets::shadow(int64_t num_sync_backwards) {
  for (const auto& spec : plan_.buckets) {
    TORCH_CHECK(!spec.sparse, "ddp: join does not support sparse gradients (parameter '",
                names_[spec.params[0]], "')");
  }
  // The same collectives, in the same order, as start_backward and the bucket launches.
  const bool map =
      options_.find_unused_parameters || (options_.static_graph && num_sync_backwards == 0);
  unused_.shadow(map, *pg_);
  runtime_->shadow_sync(num_sync_backwards);
}

}  // namespace ddp::gradients
