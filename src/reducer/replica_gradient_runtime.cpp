#include "ddp/reducer/replica_gradient_runtime.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <sstream>

#include "ddp/buckets/bucket_table.hpp"
#include "ddp/comm/control_scalars.hpp"
#include "ddp/detail/capture_status.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::reducer {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  return out.str();
}

}  // namespace

ReplicaGradientRuntime::ReplicaGradientRuntime(std::vector<at::Tensor> params,
                                               std::vector<std::string> names,
                                               comm::ProcessGroupPtr process_group,
                                               ReducerOptions options,
                                               std::vector<bool> expect_sparse)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(process_group)),
      options_(options) {
  TORCH_CHECK(pg_, "ddp: ReplicaGradientRuntime needs a process group");
  TORCH_CHECK(params_.size() == names_.size(), "ddp: ", params_.size(), " parameters but ",
              names_.size(), " names");
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
  num_plan_changes_ = 0;  // the initial plan is not a change
  autograd_hooks_ =
      std::make_unique<AutogradHooks>(params_, names_, [this](size_t i) { on_grad_ready(i); });
}

ReplicaGradientRuntime::~ReplicaGradientRuntime() = default;

void ReplicaGradientRuntime::register_comm_hook(hooks::CommHookPtr hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(hook, "ddp: register_comm_hook needs a hook");
  TORCH_CHECK(!hooks_frozen_, "ddp: register_comm_hook must be called before the first backward");
  TORCH_CHECK(!hook_, "ddp: a comm hook ('", hook_->name(),
              "') is already registered; register_comm_hook may be called once");
  hook_ = std::move(hook);
  runtime_ = std::make_unique<BucketRuntime>(params_, plan_, *layout_, pg_, Reduction::kAllReduce,
                                             hook_, num_plan_changes_);
}

void ReplicaGradientRuntime::add_listener(ReducerListener* listener, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(listener, "ddp: add_listener needs a listener");
  TORCH_CHECK(!hooks_frozen_, "ddp: ", what, " must be called before the first backward");
  listeners_.push_back(listener);
  early_finish_ = early_finish_ || listener->wants_early_finish();
}

void ReplicaGradientRuntime::remove_listener(ReducerListener* listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  early_finish_ = false;
  for (size_t i = listeners_.size(); i-- > 0;) {
    if (listeners_[i] == listener) listeners_.erase(listeners_.begin() + static_cast<long>(i));
  }
  for (auto* l : listeners_) early_finish_ = early_finish_ || l->wants_early_finish();
}

bool ReplicaGradientRuntime::backward_ran() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hooks_frozen_;
}

std::string ReplicaGradientRuntime::comm_hook_name() const {
  return hook_ ? hook_->name() : "allreduce";
}

void ReplicaGradientRuntime::on_plan_change(std::function<void(const std::string&)> callback) {
  plan_callback_ = std::move(callback);
}

void ReplicaGradientRuntime::build_plan(const std::vector<size_t>& order) {
  buckets::PlanOptions plan_options = options_.buckets;
  plan_options.order = order;
  buckets::BucketPlan plan = buckets::plan_buckets(specs_, plan_options);
  auto layout = std::make_unique<buckets::GradLayout>(plan, params_);
  // A gradient a parameter already holds (from before, or in an old bucket) moves into the new
  // bucket, so nothing accumulated is lost.
  if (options_.gradient_as_bucket_view) {
    for (size_t p = 0; p < params_.size(); ++p) layout->adopt(p, params_[p].mutable_grad(), true);
  }
  runtime_.reset();  // refers to the old plan and layout
  plan_ = std::move(plan);
  plan_order_ = order;
  layout_ = std::move(layout);
  ++num_plan_changes_;
  runtime_ = std::make_unique<BucketRuntime>(params_, plan_, *layout_, pg_, Reduction::kAllReduce,
                                             hook_, num_plan_changes_);
  if (plan_callback_) plan_callback_(buckets::format_bucket_table(plan_, specs_));
}

std::vector<size_t> ReplicaGradientRuntime::complete_order(
    const std::vector<size_t>& partial) const {
  // Parameters missing from `partial` (unused in that iteration) go last, in reverse
  // registration order, as PyTorch's rebuild does.
  return buckets::complete_order(partial, params_.size());
}

std::vector<size_t> ReplicaGradientRuntime::agree_on_order(std::vector<size_t> order,
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

bool ReplicaGradientRuntime::needs_walk() const {
  return options_.find_unused_parameters || (options_.static_graph && num_sync_backwards_ == 0);
}

void ReplicaGradientRuntime::prepare_for_backward(std::vector<bool> reachable) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  refuse_capture_if_host_bound();
  if (!reachable.empty()) {
    TORCH_CHECK(reachable.size() == params_.size(), "ddp: reachability for ", reachable.size(),
                " parameters, the reducer has ", params_.size());
    unused_.set_reachable(std::move(reachable));
  }
  planned_ = true;  // from now on only the post-iteration-1 rebuild may change the plan
  forward_end_ns_ = obs::steady_ns();
  // Gradients staged by a backward that failed before its buckets launched are stale.
  if (layout_) layout_->drop_staged();
  state_ = State::kPreparedSync;
}

void ReplicaGradientRuntime::refuse_capture_if_host_bound() const {
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

void ReplicaGradientRuntime::set_predicted_order(const std::vector<size_t>& predicted) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!planned_, "ddp: the predicted order must be set before the first backward");
  planned_ = true;
  rebuilt_ = true;  // predicted from the graph: no rebuild after iteration 1
  if (params_.empty()) return;
  auto order = agree_on_order(complete_order(predicted), "broadcast of the predicted bucket order");
  if (order != plan_order_) build_plan(order);
}

void ReplicaGradientRuntime::follow_current_stream() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  autograd_hooks_->follow_current_stream();
}

void ReplicaGradientRuntime::prepare_for_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  state_ = State::kPreparedLocal;
}

void ReplicaGradientRuntime::set_divisor_for_next_backward(int64_t divisor) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(divisor >= 1, "ddp: gradient divisor must be at least 1, got ", divisor);
  divisor_ = divisor;
}

void ReplicaGradientRuntime::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kIdle, "ddp: a gradient for parameter '", names_[index],
              "' was computed, but no forward of the DistributedDataParallel module ran since "
              "the last backward. Each backward needs its own forward (backward twice through "
              "one graph, e.g. with retain_graph, is not supported).");
  hooks_frozen_ = true;
  switch (state_) {
    case State::kIdle:
      break;  // excluded above
    case State::kPreparedLocal:
      state_ = State::kBackwardLocal;
      AutogradHooks::at_end_of_backward([this] {
        std::lock_guard<std::mutex> lock(mutex_);
        state_ = State::kIdle;
      });
      [[fallthrough]];
    case State::kBackwardLocal:
      unused_.mark_local_use(index);
      return;
    case State::kPreparedSync:
      begin_sync_backward();
      break;
    case State::kBackwardSync:
      break;
  }
  if (options_.static_graph && num_sync_backwards_ > 0) {
    TORCH_CHECK(!unused_.static_unused(index), "ddp: static_graph is set, but parameter '",
                names_[index], "' got a gradient in iteration ", num_sync_backwards_ + 1,
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
  if (early_finish_) finish_buckets(/*only_completed=*/true);
}

void ReplicaGradientRuntime::begin_sync_backward() {
  state_ = State::kBackwardSync;
  AutogradHooks::at_end_of_backward([this] { finalize_backward(); });
  observed_order_.clear();
  const BackwardStarted started{num_sync_backwards_ + 1, forward_end_ns_, params_.size(),
                                plan_.buckets.size()};
  for (auto* l : listeners_) l->backward_started(started);
  runtime_->start_sync(num_sync_backwards_, divisor_);
  const bool first_iteration = num_sync_backwards_ == 0;
  const bool recorded = options_.static_graph && !first_iteration;
  const bool map = options_.find_unused_parameters || (options_.static_graph && first_iteration);
  // Every rank issues the map's collective at the same point (first gradient), before any bucket.
  const std::vector<bool> unused = unused_.start_sync(map, recorded, *pg_);
  for (size_t p = 0; p < params_.size(); ++p) {
    if (unused[p]) mark_ready(p, /*used=*/false);
  }
}

void ReplicaGradientRuntime::mark_ready(size_t index, bool used) {
  ready_[index] = true;
  for (auto* l : listeners_) l->grad_ready(index, used);
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
    const at::Tensor& slot = layout_->slot(index);
    if (grad.defined()) {
      TORCH_CHECK(!grad.is_sparse(), "ddp: parameter '", names_[index],
                  "' has a sparse gradient, but its module did not declare sparse gradients "
                  "(torch::nn::Embedding with sparse(true) is detected)");
      if (!used) saved_unused_grads_[index] = grad.clone();
      // With bucket views the grad normally IS the slot. After zero_grad(set_to_none) the
      // accumulator made a fresh tensor: move it into the bucket and make the bucket the gradient
      // again. Without bucket views the gradient is always copied in.
      if (!layout_->holds(index, grad)) {
        // Copied at the bucket's launch with the rest of its bucket ([Note: staged copies]).
        layout_->stage(index, grad);
        if (options_.gradient_as_bucket_view) grad = slot;
      }
    } else {
      at::Tensor target = slot;
      target.zero_();  // only an unused parameter can be here; it contributes zero
    }
  }
  if (options_.overlap) launched(runtime_->register_grad_ready(index));
}

void ReplicaGradientRuntime::launched(size_t count) {
  if (count == 0 || listeners_.empty()) return;
  for (size_t b = runtime_->launched() - count; b < runtime_->launched(); ++b) {
    for (auto* l : listeners_) l->bucket_launched(b);
  }
}

void ReplicaGradientRuntime::finish_buckets(bool only_completed) {
  // Early finish (optimizer in backward): only buckets already reduced, in order, so no wait here
  // blocks the autograd thread; and only once the used map is known.
  if (only_completed && !unused_.map_ready()) return;
  while (runtime_->has_in_flight() && (!only_completed || runtime_->next_completed())) {
    write_back(runtime_->finish_next());
  }
}

void ReplicaGradientRuntime::write_back(const BucketRuntime::Finished& finished) {
  const buckets::Bucket& spec = plan_.buckets[finished.bucket];
  unused_.wait(*pg_);
  at::NoGradGuard no_grad;
  for (size_t p : spec.params) {
    at::Tensor& grad = params_[p].mutable_grad();
    const at::Tensor& slot = layout_->slot(p);
    if (!unused_.globally_used(p, *pg_)) {
      // As PyTorch: a parameter no rank used keeps the gradient it had (undefined stays undefined).
      if (saved_unused_grads_[p].defined()) {
        if (spec.sparse) {
          grad = saved_unused_grads_[p];
        } else if (layout_->holds(p, grad)) {
          grad.copy_(saved_unused_grads_[p]);
        }
      }
      continue;
    }
    if (spec.sparse) {
      grad = finished.sparse_result;
    } else if (options_.gradient_as_bucket_view) {
      if (!layout_->holds(p, grad)) grad = slot;
    } else if (grad.defined()) {
      grad.copy_(slot);
    } else {
      grad = slot.clone();
    }
  }
  const BucketFinished event{finished.bucket, &spec.params, finished.comm_done_ns};
  for (auto* l : listeners_) l->bucket_finished(event);
}

void ReplicaGradientRuntime::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kBackwardSync, "ddp: end of backward in unexpected state ",
              state_name(state_));
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
    launched(count);
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
  if (failure || !missing.empty()) {
    reset_iteration();
    if (failure) std::rethrow_exception(failure);
    const bool graph_changed = options_.static_graph && num_sync_backwards_ > 0;
    TORCH_CHECK(!graph_changed, "ddp: static_graph is set, but ", missing.size(),
                " parameter(s) that had gradients in the first iteration got none in iteration ",
                num_sync_backwards_ + 1, ": ", join_names(missing),
                ". The graph changed; use find_unused_parameters instead of static_graph.");
    TORCH_CHECK(false, "ddp: ", missing.size(),
                " parameter(s) received no gradient in this backward: ", join_names(missing),
                ". Their buckets could not be reduced. If these parameters are not used in every "
                "forward, construct DistributedDataParallel with find_unused_parameters = true; "
                "if they never take part, set requires_grad to false or list them in "
                "params_to_ignore.");
  }
  if (options_.static_graph && num_sync_backwards_ == 0) unused_.record_static();
  ++num_sync_backwards_;
  for (auto* l : listeners_) l->iteration_finished(num_sync_backwards_);
  if (!rebuilt_) {
    // No graph planning: the order just observed replaces reverse registration order, once.
    // Rank 0's order is broadcast so every rank builds the same buckets.
    rebuilt_ = true;
    auto order =
        agree_on_order(complete_order(observed_order_), "broadcast of the observed bucket order");
    if (order != plan_order_) build_plan(order);
  }
  reset_iteration();
}

void ReplicaGradientRuntime::reset_iteration() {
  state_ = State::kIdle;
  divisor_ = 0;
  ready_.assign(params_.size(), false);
  for (auto& g : saved_unused_grads_) g.reset();
  runtime_->reset();
  unused_.reset();
}

void ReplicaGradientRuntime::shadow_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kIdle, "ddp: join's shadow backward in state ", state_name(state_));
  hooks_frozen_ = true;
  for (const auto& spec : plan_.buckets) {
    TORCH_CHECK(!spec.sparse, "ddp: join does not support sparse gradients (parameter '",
                names_[spec.params[0]], "')");
  }
  // The same collectives, in the same order, as begin_sync_backward and the bucket launches.
  const bool map =
      options_.find_unused_parameters || (options_.static_graph && num_sync_backwards_ == 0);
  unused_.shadow(map, *pg_);
  runtime_->shadow_sync(num_sync_backwards_);
}

}  // namespace ddp::reducer
