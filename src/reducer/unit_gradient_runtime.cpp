#include "ddp/reducer/unit_gradient_runtime.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/obs/timeline.hpp"

namespace ddp::reducer {

UnitGradientRuntime::UnitGradientRuntime(std::vector<ReduceUnit> units, comm::ProcessGroupPtr pg,
                                         UnitObserver& observer)
    : units_(std::move(units)), pg_(std::move(pg)), observer_(observer) {
  TORCH_CHECK(pg_, "ddp: UnitGradientRuntime needs a process group");
  for (size_t u = 0; u < units_.size(); ++u) {
    const ReduceUnit& unit = units_[u];
    TORCH_CHECK(unit.params.size() == unit.names.size() &&
                    unit.params.size() == unit.offsets.size() && !unit.params.empty(),
                "ddp: UnitGradientRuntime: unit '", unit.name, "' has ", unit.params.size(),
                " parameters, ", unit.names.size(), " names and ", unit.offsets.size(), " offsets");
    TORCH_CHECK(unit.storage != nullptr, "ddp: UnitGradientRuntime: unit '", unit.name,
                "' has no storage");
    first_param_.push_back(params_.size());
    for (size_t i = 0; i < unit.params.size(); ++i) {
      unit_of_param_.push_back(u);
      member_of_param_.push_back(i);
      params_.push_back(unit.params[i]);
      names_.push_back(unit.names[i]);
    }
  }
  ready_.assign(params_.size(), false);
  ready_count_.assign(units_.size(), 0);
  filled_.assign(units_.size(), false);
  build_plan(buckets::reverse_registration_order(units_.size()));
  plan_epoch_ = 0;  // the initial plan is not a change
  // [Note: hooks that survive set_]
  for (size_t p = 0; p < params_.size(); ++p) {
    hook_ids_.push_back(
        params_[p].register_hook([this, p](const at::Tensor& grad) { on_grad(p, grad); }));
  }
}

UnitGradientRuntime::~UnitGradientRuntime() {
  for (size_t p = 0; p < hook_ids_.size(); ++p) params_[p].remove_hook(hook_ids_[p]);
}

void UnitGradientRuntime::register_comm_hook(hooks::CommHookPtr hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(hook, "ddp: register_comm_hook needs a hook");
  TORCH_CHECK(!hooks_frozen_, "ddp: register_comm_hook must be called before the first backward");
  TORCH_CHECK(!hook_, "ddp: a comm hook ('", hook_->name(),
              "') is already registered; register_comm_hook may be called once");
  hook_ = std::move(hook);
  runtime_ = std::make_unique<BucketRuntime>(params_, plan_, inputs_, pg_,
                                             Reduction::kReduceScatter, hook_, plan_epoch_);
}

void UnitGradientRuntime::add_listener(ReducerListener* listener, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(listener, "ddp: add_listener needs a listener");
  TORCH_CHECK(!hooks_frozen_, "ddp: ", what, " must be called before the first backward");
  listeners_.push_back(listener);
}

std::string UnitGradientRuntime::comm_hook_name() const {
  return hook_ ? hook_->name() : "reduce_scatter";
}

void UnitGradientRuntime::build_plan(const std::vector<size_t>& unit_order) {
  buckets::BucketPlan plan;
  plan.bucket_of.assign(params_.size(), 0);
  plan.position_in_bucket.assign(params_.size(), 0);
  bucket_of_.assign(units_.size(), 0);
  for (size_t b = 0; b < unit_order.size(); ++b) {
    const size_t u = unit_order[b];
    const ReduceUnit& unit = units_[u];
    buckets::Bucket bucket;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const size_t p = first_param_[u] + i;
      bucket.params.push_back(p);
      bucket.offsets.push_back(unit.offsets[i]);
      plan.bucket_of[p] = b;
      plan.position_in_bucket[p] = i;
    }
    bucket.numel = pg_->world_size() * unit.row_numel;
    bucket.dtype = c10::typeMetaToScalarType(unit.options.dtype());
    bucket.device = unit.options.device();
    bucket.bytes = static_cast<size_t>(bucket.numel) * c10::elementSize(bucket.dtype);
    plan.buckets.push_back(std::move(bucket));
    bucket_of_[u] = b;
  }
  runtime_.reset();  // refers to the old plan
  plan_ = std::move(plan);
  unit_at_ = unit_order;
  inputs_.tensors.assign(plan_.buckets.size(), at::Tensor());
  shards_.assign(plan_.buckets.size(), at::Tensor());
  comm_done_ns_.assign(plan_.buckets.size(), -1);
  ++plan_epoch_;
  runtime_ = std::make_unique<BucketRuntime>(params_, plan_, inputs_, pg_,
                                             Reduction::kReduceScatter, hook_, plan_epoch_);
}

void UnitGradientRuntime::prepare_for_backward(const std::vector<size_t>& order) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward of a sharded module while its backward is running (state: ",
              iteration_state_name(state_), ")");
  // The expected order, then the units it lacks in reverse unit order.
  const std::vector<size_t> complete = buckets::complete_order(order, units_.size());
  if (complete != unit_at_) build_plan(complete);
  forward_end_ns_ = obs::steady_ns();
  state_ = State::kPreparedSync;
}

void UnitGradientRuntime::note_forward_end() {
  std::lock_guard<std::mutex> lock(mutex_);
  forward_end_ns_ = obs::steady_ns();
}

void UnitGradientRuntime::prepare_for_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward of a sharded module while its backward is running (state: ",
              iteration_state_name(state_), ")");
  state_ = State::kPreparedLocal;
}

int64_t UnitGradientRuntime::input_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const auto& t : inputs_.tensors) {
    if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

bool UnitGradientRuntime::filled(size_t unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return filled_[unit];
}

void UnitGradientRuntime::on_grad(size_t p, const at::Tensor& incoming) {
  std::unique_lock<std::mutex> lock(mutex_);
  const size_t u = unit_of_param_[p];
  drop_stale_grad();
  TORCH_CHECK(state_ != State::kIdle, "ddp: a gradient for parameter '", names_[p],
              "' was computed, but no forward of the sharded module ran since the last backward. "
              "Each backward needs its own forward through the wrapper.");
  hooks_frozen_ = true;
  const bool first = state_ == State::kPreparedSync || state_ == State::kPreparedLocal;
  if (state_ == State::kPreparedSync) {
    begin_sync_backward();
  } else if (state_ == State::kPreparedLocal) {
    state_ = State::kBackwardLocal;
  }
  TORCH_CHECK(!filled_[u], "ddp: parameter '", names_[p], "' of unit '", units_[u].name,
              "' got a gradient after the unit's reduce-scatter was issued in this backward (a "
              "second backward through the same forward, or a parameter used again after its "
              "unit's gradients were complete); each parameter takes part in one backward per "
              "forward");
  bool done = false;
  if (!ready_[p]) {
    ready_[p] = true;
    done = ++ready_count_[u] == units_[u].params.size();
  }
  if (state_ == State::kBackwardSync) {
    for (auto* l : listeners_) l->grad_ready(p, /*used=*/true);
    if (done) {
      fill_and_register(u, static_cast<int64_t>(member_of_param_[p]), incoming);
      // The engine accumulates `incoming` into this parameter's .grad after this hook: dropped
      // at the next gradient (or the end of backward), which no longer needs it.
      stale_grad_ = static_cast<int64_t>(p);
    }
  }
  // The sharded runtime's reactions (queueing its end-of-backward work, releasing the unit's
  // full parameters) do not call back into this object.
  lock.unlock();
  if (first) observer_.backward_began();
  if (done) observer_.unit_done(u);
}

void UnitGradientRuntime::begin_sync_backward() {
  state_ = State::kBackwardSync;
  const BackwardStarted started{num_sync_backwards_ + 1, forward_end_ns_, params_.size(),
                                plan_.buckets.size()};
  for (auto* l : listeners_) l->backward_started(started);
  runtime_->start_sync(num_sync_backwards_, 0);
}

void UnitGradientRuntime::drop_stale_grad() {
  if (stale_grad_ < 0) return;
  params_[static_cast<size_t>(stale_grad_)].mutable_grad() = at::Tensor();
  stale_grad_ = -1;
}

void UnitGradientRuntime::finish_in_flight() {
  while (runtime_->has_in_flight()) {
    const BucketRuntime::Finished finished = runtime_->finish_next();
    shards_[finished.bucket] = finished.shard;
    comm_done_ns_[finished.bucket] = finished.comm_done_ns;
    inputs_.tensors[finished.bucket] = at::Tensor();  // the input is no longer needed
  }
}

void UnitGradientRuntime::fill_and_register(size_t u, int64_t member, const at::Tensor& incoming) {
  // One unit's input at a time: the reductions already launched are finished first.
  finish_in_flight();
  const size_t b = bucket_of_[u];
  const ReduceUnit& unit = units_[u];
  at::Tensor input = at::empty({pg_->world_size() * unit.row_numel}, unit.options);
  {
    at::NoGradGuard no_grad;
    unit.storage->fill_reduce_input(input, member, incoming);
  }
  inputs_.tensors[b] = input;
  filled_[u] = true;
  size_t launched = 0;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    launched += runtime_->register_grad_ready(first_param_[u] + i);
  }
  for (size_t k = runtime_->launched() - launched; k < runtime_->launched(); ++k) {
    for (auto* l : listeners_) l->bucket_launched(k);
  }
}

bool UnitGradientRuntime::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_stale_grad();
  // Prepared but no gradient reached a unit: still a synchronized backward, whose units the
  // other ranks may be reducing (their gradients can depend on the data), so zeros are reduced.
  if (state_ == State::kPreparedSync) begin_sync_backward();
  if (state_ != State::kBackwardSync) {
    reset_iteration();
    return false;
  }
  std::exception_ptr failure;
  try {
    // Units whose gradients did not all arrive (unused parameters) are reduced now, in plan
    // order: every rank issues the same collectives, and a missing gradient counts as zeros.
    for (size_t b = 0; b < plan_.buckets.size(); ++b) {
      const size_t u = unit_at_[b];
      if (filled_[u]) continue;
      for (size_t i = 0; i < units_[u].params.size(); ++i) {
        const size_t p = first_param_[u] + i;
        if (!ready_[p]) {
          for (auto* l : listeners_) l->grad_ready(p, /*used=*/false);
        }
      }
      fill_and_register(u, -1, at::Tensor());
    }
    finish_in_flight();
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    reset_iteration();
    std::rethrow_exception(failure);
  }
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    units_[unit_at_[b]].storage->finish_reduce_scatter(shards_[b]);
    shards_[b] = at::Tensor();
    const BucketFinished event{b, &plan_.buckets[b].params, comm_done_ns_[b]};
    for (auto* l : listeners_) l->bucket_finished(event);
  }
  ++num_sync_backwards_;
  for (auto* l : listeners_) l->iteration_finished(num_sync_backwards_);
  reset_iteration();
  return true;
}

void UnitGradientRuntime::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_iteration();
}

void UnitGradientRuntime::reset_iteration() {
  state_ = State::kIdle;
  stale_grad_ = -1;
  ready_.assign(params_.size(), false);
  ready_count_.assign(units_.size(), 0);
  filled_.assign(units_.size(), false);
  runtime_->reset();
  for (auto& t : inputs_.tensors) t = at::Tensor();
  for (auto& t : shards_) t = at::Tensor();
}

}  // namespace ddp::reducer
