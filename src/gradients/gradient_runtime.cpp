#include "ddp/gradients/gradient_runtime.hpp"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include "ddp/autograd/end_of_backward.hpp"
#include "ddp/buckets/bucket_table.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::gradients {

GradientRuntime::GradientRuntime(comm::ProcessGroupPtr pg, std::vector<ReduceUnit> units,
                                 UnitObserver* observer, ReplicaParams replicas,
                                 UnitGroups unit_groups)
    : pg_(std::move(pg)), observer_(observer) {
  TORCH_CHECK(pg_, "ddp: GradientRuntime needs a process group");
  if (!units.empty()) {
    TORCH_CHECK(observer_ != nullptr, "ddp: GradientRuntime: sharded units need an observer");
    units_ = std::make_unique<UnitBuckets>(
        std::move(units), unit_groups.shard ? std::move(unit_groups.shard) : pg_,
        std::move(unit_groups.replicate),
        [this](size_t p, const at::Tensor& g) { on_unit_grad(p, g); });
  }
  // Without units the replicated group is the model (DDP), even with no parameter to reduce.
  if (!units_ || !replicas.params.empty()) {
    replicas_ = std::make_unique<ReplicaBuckets>(std::move(replicas), pg_,
                                                 [this](size_t i) { on_replica_grad(i); });
  }
  size_t first_bucket = 0;
  if (units_) {
    for (size_t p = 0; p < units_->params().size(); ++p) {
      params_.push_back(units_->params()[p]);
      names_.push_back(units_->names()[p]);
      specs_.push_back(units_->specs()[p]);
    }
    first_bucket = units_->plan().buckets.size();  // one per unit, whatever their order
  }
  if (replicas_) {
    replica_events_.set_first(params_.size(), first_bucket);
    for (size_t p = 0; p < replicas_->params().size(); ++p) {
      params_.push_back(replicas_->params()[p]);
      names_.push_back(replicas_->names()[p]);
      specs_.push_back(replicas_->specs()[p]);
    }
  }
  plan_changed(/*announce=*/false);
  num_plan_changes_ = 0;  // the initial plan is not a change
}

GradientRuntime::~GradientRuntime() = default;

void GradientRuntime::register_comm_hook(hooks::CommHookPtr hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(hook, "ddp: register_comm_hook needs a hook");
  TORCH_CHECK(!hooks_frozen_, "ddp: register_comm_hook must be called before the first backward");
  TORCH_CHECK(!hook_, "ddp: a comm hook ('", hook_->name(),
              "') is already registered; register_comm_hook may be called once");
  hook_ = std::move(hook);
  if (units_) units_->make_runtime(hook_, num_plan_changes_, unit_events_.first_bucket());
  if (replicas_) replicas_->make_runtime(hook_, num_plan_changes_, replica_events_.first_bucket());
}

void GradientRuntime::add_listener(GradientListener* listener, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(listener, "ddp: add_listener needs a listener");
  TORCH_CHECK(!hooks_frozen_, "ddp: ", what, " must be called before the first backward");
  listeners_.push_back(listener);
  early_finish_ = early_finish_ || listener->wants_early_finish();
}

void GradientRuntime::remove_listener(GradientListener* listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  early_finish_ = false;
  for (size_t i = listeners_.size(); i-- > 0;) {
    if (listeners_[i] == listener) listeners_.erase(listeners_.begin() + static_cast<long>(i));
  }
  for (auto* l : listeners_) early_finish_ = early_finish_ || l->wants_early_finish();
}

bool GradientRuntime::backward_ran() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hooks_frozen_;
}

void GradientRuntime::require_not_in_backward(const char* what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  check_not_in_backward(what);
}

std::string GradientRuntime::comm_hook_name() const {
  if (hook_) return hook_->name();
  return units_ ? "reduce_scatter" : "allreduce";
}

void GradientRuntime::on_plan_change(std::function<void(const std::string&)> callback) {
  plan_callback_ = std::move(callback);
}

std::string GradientRuntime::bucket_table() const {
  return buckets::format_bucket_table(plan_, specs_);
}

void GradientRuntime::plan_changed(bool announce) {
  ++num_plan_changes_;
  // One epoch for every group: a hook keyed by (index, epoch) re-keys all of its state at once.
  if (units_) units_->make_runtime(hook_, num_plan_changes_, unit_events_.first_bucket());
  if (replicas_) replicas_->make_runtime(hook_, num_plan_changes_, replica_events_.first_bucket());
  merge_plans();
  if (announce && plan_callback_) plan_callback_(bucket_table());
}

void GradientRuntime::merge_plans() {
  plan_ = buckets::BucketPlan();
  size_t first_param = 0;
  for (const buckets::BucketPlan* group :
       {units_ ? &units_->plan() : nullptr, replicas_ ? &replicas_->plan() : nullptr}) {
    if (group == nullptr) continue;
    const size_t first_bucket = plan_.buckets.size();
    for (buckets::Bucket bucket : group->buckets) {
      for (auto& p : bucket.params) p += first_param;
      plan_.buckets.push_back(std::move(bucket));
    }
    for (size_t p = 0; p < group->bucket_of.size(); ++p) {
      plan_.bucket_of.push_back(first_bucket + group->bucket_of[p]);
      plan_.position_in_bucket.push_back(group->position_in_bucket[p]);
    }
    first_param += group->bucket_of.size();
  }
}

void GradientRuntime::check_not_in_backward(const char* what) const {
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal, "ddp: ", what,
              " while a backward is running (state: ", iteration_state_name(state_), ")");
}

void GradientRuntime::follow_current_stream() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_not_in_backward("forward called");
  if (replicas_) replicas_->follow_current_stream();
}

bool GradientRuntime::needs_walk() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return replicas_ && replicas_->needs_walk(num_sync_backwards_);
}

bool GradientRuntime::awaiting_plan() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return replicas_ && replicas_->awaiting_plan();
}

void GradientRuntime::set_predicted_order(const std::vector<size_t>& predicted) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(replicas_, "ddp: a predicted order needs replicated parameters");
  if (replicas_->set_predicted_order(predicted)) plan_changed(/*announce=*/true);
}

void GradientRuntime::prepare_for_backward(std::vector<bool> reachable,
                                           const std::vector<size_t>& unit_order) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_not_in_backward("forward called");
  bool changed = false;
  if (units_) changed = units_->set_order(unit_order);
  if (replicas_) replicas_->prepare(std::move(reachable));
  if (changed) plan_changed(/*announce=*/true);
  forward_end_ns_ = obs::steady_ns();
  state_ = State::kPreparedSync;
}

void GradientRuntime::note_forward_end() {
  std::lock_guard<std::mutex> lock(mutex_);
  forward_end_ns_ = obs::steady_ns();
}

void GradientRuntime::prepare_for_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_not_in_backward("forward called");
  state_ = State::kPreparedLocal;
}

void GradientRuntime::set_divisor_for_next_backward(int64_t divisor) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(divisor >= 1, "ddp: gradient divisor must be at least 1, got ", divisor);
  TORCH_CHECK(replicas_, "ddp: a gradient divisor needs replicated parameters");
  replicas_->set_divisor(divisor);
}

bool GradientRuntime::filled(size_t unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return units_ && units_->filled(unit);
}

int64_t GradientRuntime::input_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return units_ ? units_->input_bytes() : 0;
}

int64_t GradientRuntime::num_synchronized_backwards() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_sync_backwards_;
}

bool GradientRuntime::start_backward_once() {
  hooks_frozen_ = true;
  switch (state_) {
    case State::kPreparedLocal:
      state_ = State::kBackwardLocal;
      if (units_) units_->start_backward(/*sync=*/false, num_sync_backwards_);
      autograd::at_end_of_backward([this] { end_local_backward(); });
      return true;
    case State::kPreparedSync:
      start_sync_backward();
      return true;
    case State::kIdle:
    case State::kBackwardSync:
    case State::kBackwardLocal:
      break;
  }
  return false;
}

void GradientRuntime::start_sync_backward() {
  state_ = State::kBackwardSync;
  autograd::at_end_of_backward([this] { finish_backward(); });
  const BackwardStarted started{num_sync_backwards_ + 1, forward_end_ns_, params_.size(),
                                plan_.buckets.size()};
  for (auto* l : listeners_) l->backward_started(started);
  if (units_) units_->start_backward(/*sync=*/true, num_sync_backwards_);
  if (replicas_) replicas_->start_backward(num_sync_backwards_, replica_events_);
}

void GradientRuntime::start_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::kPreparedSync && state_ != State::kPreparedLocal) return;
  start_backward_once();
}

void GradientRuntime::on_replica_grad(size_t index) {
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kIdle, "ddp: a gradient for parameter '", replicas_->names()[index],
              "' was computed, but no forward of the DistributedDataParallel module ran since "
              "the last backward. Each backward needs its own forward (backward twice through "
              "one graph, e.g. with retain_graph, is not supported).");
  const bool first = start_backward_once();
  if (state_ == State::kBackwardLocal) {
    replicas_->mark_local_use(index);
  } else {
    replicas_->grad_ready(index, num_sync_backwards_, early_finish_, replica_events_);
  }
  // DEFAULT: a replicated parameter's gradient may be the backward's first; the sharded runtime
  // hears of it as of a unit's (UnitObserver::backward_started: the first gradient of a backward).
  lock.unlock();
  if (first && observer_ != nullptr) observer_->backward_started();
}

void GradientRuntime::on_unit_grad(size_t p, const at::Tensor& incoming) {
  std::unique_lock<std::mutex> lock(mutex_);
  units_->drop_stale_grad();
  TORCH_CHECK(state_ != State::kIdle, "ddp: a gradient for parameter '", units_->names()[p],
              "' was computed, but no forward of the sharded module ran since the last backward. "
              "Each backward needs its own forward through the wrapper.");
  const bool first = start_backward_once();
  const int64_t done =
      units_->grad_ready(p, incoming, state_ == State::kBackwardSync, unit_events_);
  // The sharded runtime's reactions (queueing its end-of-backward work, releasing the unit's
  // full parameters) do not call back into this object's locked state.
  lock.unlock();
  if (first) observer_->backward_started();
  if (done >= 0) observer_->unit_done(static_cast<size_t>(done));
}

void GradientRuntime::end_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = State::kIdle;
  if (units_) units_->reset();
}

void GradientRuntime::finish_backward() {
  RECORD_USER_SCOPE("ddp::finish_backward");
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kBackwardSync, "ddp: end of backward in unexpected state ",
              iteration_state_name(state_));
  // Both groups finish what they launched even when the other failed: those collectives are
  // matched with the other ranks' and must not be left half-done.
  std::exception_ptr failure;
  if (units_) {
    try {
      units_->finish_backward(unit_events_);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (replicas_) {
    try {
      replicas_->finish_backward(num_sync_backwards_, replica_events_);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    reset_iteration();
    std::rethrow_exception(failure);
  }
  if (replicas_) replicas_->succeeded(num_sync_backwards_);
  ++num_sync_backwards_;
  for (auto* l : listeners_) l->backward_finished(num_sync_backwards_);
  if (replicas_ && replicas_->rebuild_once()) plan_changed(/*announce=*/true);
  reset_iteration();
}

void GradientRuntime::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_iteration();
}

void GradientRuntime::reset_iteration() {
  state_ = State::kIdle;
  if (units_) units_->reset();
  if (replicas_) replicas_->reset();
}

void GradientRuntime::shadow_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kIdle, "ddp: join's shadow backward in state ",
              iteration_state_name(state_));
  TORCH_CHECK(!units_, "ddp: join needs DistributedDataParallel (sharded units cannot shadow)");
  hooks_frozen_ = true;
  replicas_->shadow(num_sync_backwards_);
}

}  // namespace ddp::gradients
