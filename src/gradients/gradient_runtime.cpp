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
  // The strategies are chosen here, once: units (if any) first, then the replicated parameters.
  const bool has_units = !units.empty();
  if (has_units) {
    TORCH_CHECK(observer_ != nullptr, "ddp: GradientRuntime: sharded units need an observer");
    const size_t k = strategies_.size();
    strategies_.push_back(std::make_unique<UnitBuckets>(
        std::move(units), unit_groups.shard ? std::move(unit_groups.shard) : pg_,
        std::move(unit_groups.replicate),
        [this, k](size_t p, const at::Tensor& g) { on_gradient(k, p, g); }, listeners_));
  }
  // Without units the replicated parameters are the model (DDP), even with none to reduce.
  if (!has_units || !replicas.params.empty()) {
    const size_t k = strategies_.size();
    strategies_.push_back(std::make_unique<ReplicaBuckets>(
        std::move(replicas), pg_, [this, k](size_t i) { on_gradient(k, i, at::Tensor()); },
        listeners_));
  }
  // One numbering: each strategy's parameters and buckets after the previous one's. Only the
  // last strategy's bucket count may change later (a unit strategy has one bucket per unit).
  size_t first_bucket = 0;
  for (auto& strategy : strategies_) {
    strategy->events().set_first(params_.size(), first_bucket);
    for (size_t p = 0; p < strategy->params().size(); ++p) {
      params_.push_back(strategy->params()[p]);
      names_.push_back(strategy->names()[p]);
      specs_.push_back(strategy->specs()[p]);
    }
    first_bucket += strategy->plan().buckets.size();
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
  for (auto& strategy : strategies_) strategy->make_runtime(hook_, num_plan_changes_);
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
  return strategies_.front()->builtin_reduction();  // the units' when there are units
}

void GradientRuntime::on_plan_change(std::function<void(const std::string&)> callback) {
  plan_callback_ = std::move(callback);
}

std::string GradientRuntime::bucket_table() const {
  return buckets::format_bucket_table(plan_, specs_);
}

void GradientRuntime::plan_changed(bool announce) {
  ++num_plan_changes_;
  // One epoch for every strategy: a hook keyed by (index, epoch) re-keys all of its state at once.
  for (auto& strategy : strategies_) strategy->make_runtime(hook_, num_plan_changes_);
  merge_plans();
  if (announce && plan_callback_) plan_callback_(bucket_table());
}

void GradientRuntime::merge_plans() {
  plan_ = buckets::BucketPlan();
  size_t first_param = 0;
  for (const auto& strategy : strategies_) {
    const buckets::BucketPlan* group = &strategy->plan();
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
  for (auto& strategy : strategies_) strategy->follow_current_stream();
}

bool GradientRuntime::needs_walk() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& strategy : strategies_) {
    if (strategy->needs_walk(num_sync_backwards_)) return true;
  }
  return false;
}

bool GradientRuntime::awaiting_plan() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& strategy : strategies_) {
    if (strategy->awaiting_plan()) return true;
  }
  return false;
}

void GradientRuntime::set_predicted_order(const std::vector<size_t>& predicted) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool taken = false;
  bool changed = false;
  for (auto& strategy : strategies_) {
    const std::optional<bool> result = strategy->set_predicted_order(predicted);
    taken = taken || result.has_value();
    changed = changed || result.value_or(false);
  }
  TORCH_CHECK(taken, "ddp: a predicted order needs replicated parameters");
  if (changed) plan_changed(/*announce=*/true);
}

void GradientRuntime::prepare_for_backward(std::vector<bool> reachable,
                                           const std::vector<size_t>& unit_order) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_not_in_backward("forward called");
  bool changed = false;
  for (auto& strategy : strategies_) {
    changed = strategy->prepare(reachable, unit_order) || changed;
  }
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
  bool taken = false;
  for (auto& strategy : strategies_) {
    if (!strategy->joins()) continue;
    strategy->set_divisor(divisor);
    taken = true;
  }
  TORCH_CHECK(taken, "ddp: a gradient divisor needs replicated parameters");
}

bool GradientRuntime::filled(size_t unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& strategy : strategies_) {
    if (strategy->filled(unit)) return true;
  }
  return false;
}

int64_t GradientRuntime::input_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const auto& strategy : strategies_) bytes += strategy->input_bytes();
  return bytes;
}

const at::Tensor& GradientRuntime::bucket_buffer(size_t b) const {
  TORCH_CHECK(b < plan_.buckets.size(), "ddp: bucket ", b, " of ", plan_.buckets.size());
  size_t k = strategies_.size() - 1;
  while (b < strategies_[k]->events().first_bucket()) --k;  // the first strategy's is 0
  return strategies_[k]->bucket_buffer(b - strategies_[k]->events().first_bucket());
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
      for (auto& strategy : strategies_) {
        strategy->start_backward(/*sync=*/false, num_sync_backwards_);
      }
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
  for (auto& strategy : strategies_) strategy->start_backward(/*sync=*/true, num_sync_backwards_);
}

void GradientRuntime::start_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::kPreparedSync && state_ != State::kPreparedLocal) return;
  start_backward_once();
}

void GradientRuntime::on_gradient(size_t k, size_t p, const at::Tensor& incoming) {
  ReduceStrategy& strategy = *strategies_[k];
  std::unique_lock<std::mutex> lock(mutex_);
  strategy.before_gradient();
  TORCH_CHECK(state_ != State::kIdle, strategy.gradient_without_forward(p));
  const bool first = start_backward_once();
  const GradientArrival arrival{state_ == State::kBackwardSync, num_sync_backwards_, early_finish_};
  const int64_t done = strategy.gradient_ready(p, incoming, arrival);
  // The sharded runtime's reactions (queueing its end-of-backward work, releasing the unit's
  // full parameters) do not call back into this object's locked state. Under DEFAULT a
  // replicated parameter's gradient may be the backward's first: the sharded runtime hears of it
  // as of a unit's (UnitObserver::backward_started).
  lock.unlock();
  if (first && observer_ != nullptr) observer_->backward_started();
  if (done >= 0) observer_->unit_done(static_cast<size_t>(done));
}

void GradientRuntime::end_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = State::kIdle;
  for (auto& strategy : strategies_) strategy->end_local_backward();
}

void GradientRuntime::finish_backward() {
  RECORD_USER_SCOPE("ddp::finish_backward");
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kBackwardSync, "ddp: end of backward in unexpected state ",
              iteration_state_name(state_));
  // Every strategy finishes what it launched even when another failed: those collectives are
  // matched with the other ranks' and must not be left half-done.
  std::exception_ptr failure;
  for (auto& strategy : strategies_) {
    try {
      strategy->finish_backward(num_sync_backwards_);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    reset_iteration();
    std::rethrow_exception(failure);
  }
  for (auto& strategy : strategies_) strategy->succeeded(num_sync_backwards_);
  ++num_sync_backwards_;
  for (auto* l : listeners_) l->backward_finished(num_sync_backwards_);
  bool rebuilt = false;
  for (auto& strategy : strategies_) rebuilt = strategy->rebuild_once() || rebuilt;
  if (rebuilt) plan_changed(/*announce=*/true);
  reset_iteration();
}

void GradientRuntime::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_iteration();
}

void GradientRuntime::reset_iteration() {
  state_ = State::kIdle;
  for (auto& strategy : strategies_) strategy->reset();
}

void GradientRuntime::shadow_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kIdle, "ddp: join's shadow backward in state ",
              iteration_state_name(state_));
  for (const auto& strategy : strategies_) {
    TORCH_CHECK(strategy->joins(),
                "ddp: join needs DistributedDataParallel (sharded units cannot shadow)");
  }
  hooks_frozen_ = true;
  for (auto& strategy : strategies_) strategy->shadow(num_sync_backwards_);
}

}  // namespace ddp::gradients
