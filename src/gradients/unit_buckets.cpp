#include "ddp/gradients/unit_buckets.hpp"

#include <ATen/ATen.h>

#include <c10/util/Exception.h>
#include <algorithm>

#include "ddp/autograd/accumulation_hook.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::gradients {

UnitBuckets::UnitBuckets(std::vector<ReduceUnit> units, comm::ProcessGroupPtr pg,
                         comm::ProcessGroupPtr replicate,
                         std::function<void(size_t, const at::Tensor&)> on_grad,
                         const std::vector<GradientListener*>& listeners)
    : ReduceStrategy(listeners), units_(std::move(units)), pg_(std::move(pg)) {
  // One replica is no replication: nothing to average across.
  if (replicate && replicate->world_size() > 1) replicate_ = std::move(replicate);
  for (size_t u = 0; u < units_.size(); ++u) {
    const ReduceUnit& unit = units_[u];
    TORCH_CHECK(unit.params.size() == unit.names.size() &&
                    unit.params.size() == unit.offsets.size() && !unit.params.empty(),
                "ddp: unit '", unit.name, "' has ", unit.params.size(), " parameters, ",
                unit.names.size(), " names and ", unit.offsets.size(), " offsets");
    TORCH_CHECK(unit.storage != nullptr, "ddp: unit '", unit.name, "' has no storage");
    first_param_.push_back(params_.size());
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const at::Tensor& p = unit.params[i];
      unit_of_param_.push_back(u);
      member_of_param_.push_back(i);
      params_.push_back(p);
      names_.push_back(unit.names[i]);
      specs_.push_back({unit.names[i], p.numel(), p.scalar_type(), p.device(), false});
    }
  }
  ready_.assign(params_.size(), false);
  filled_.assign(units_.size(), false);
  set_order(buckets::reverse_registration_order(units_.size()));
  // [Note: hooks that survive set_], [Note: a leaf's hook runs once per accumulation]
  for (size_t p = 0; p < params_.size(); ++p) {
    hook_ids_.push_back(autograd::add_accumulation_hook(
        params_[p], [on_grad, p](const at::Tensor& grad) { on_grad(p, grad); }));
  }
}

UnitBuckets::~UnitBuckets() {
  for (size_t p = 0; p < hook_ids_.size(); ++p) params_[p].remove_hook(hook_ids_[p]);
}

void UnitBuckets::make_runtime(const hooks::CommHookPtr& hook, int64_t plan_epoch) {
  runtime_.reset();
  plan_epoch_ = plan_epoch;
  const size_t first_index = events_.first_bucket();
  // Hybrid: the hook takes the cross-replica average, the reduce-scatter is the built-in one.
  cross_replica_hook_ = replicate_ ? hook : nullptr;
  runtime_ = std::make_unique<BucketRuntime>(params_, plan_, inputs_, pg_,
                                             replicate_ ? nullptr : hook, plan_epoch, first_index);
}

bool UnitBuckets::prepare(const std::vector<bool>& /*reachable*/,
                          const std::vector<size_t>& unit_order) {
  return set_order(unit_order);
}

bool UnitBuckets::set_order(const std::vector<size_t>& order) {
  const std::vector<size_t> unit_order = buckets::complete_order(order, units_.size());
  if (!plan_.buckets.empty() && unit_order == unit_at_) return false;
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
      // A member's block of a row runs to the next member's offset (the last one's to S).
      const int64_t end = i + 1 < unit.params.size() ? unit.offsets[i + 1] : unit.row_numel;
      bucket.lengths.push_back(end - unit.offsets[i]);
      plan.bucket_of[p] = b;
      plan.position_in_bucket[p] = i;
    }
    bucket.numel = pg_->world_size() * unit.row_numel;
    bucket.dtype = c10::typeMetaToScalarType(unit.options.dtype());
    bucket.device = unit.options.device();
    bucket.bytes = static_cast<size_t>(bucket.numel) * c10::elementSize(bucket.dtype);
    bucket.reduction = buckets::Reduction::kReduceScatter;
    bucket.unit = unit.index;
    plan.buckets.push_back(std::move(bucket));
    bucket_of_[u] = b;
  }
  runtime_.reset();  // refers to the old plan
  plan_ = std::move(plan);
  unit_at_ = unit_order;
  inputs_.tensors.assign(plan_.buckets.size(), at::Tensor());
  shards_.assign(plan_.buckets.size(), at::Tensor());
  cross_work_.assign(plan_.buckets.size(), {});
  cross_what_.clear();
  for (const size_t u : unit_order) {
    cross_what_.push_back("the cross-replica average of unit '" + units_[u].name +
                          "''s gradient shard (hybrid sharding)");
  }
  cross_future_.assign(plan_.buckets.size(), {});
  comm_done_ns_.assign(plan_.buckets.size(), -1);
  return true;
}

int64_t UnitBuckets::input_bytes() const {
  int64_t bytes = 0;
  for (const auto& t : inputs_.tensors) {
    if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

void UnitBuckets::start_backward(bool sync, int64_t num_sync_backwards) {
  iteration_ = num_sync_backwards;
  if (sync) {
    runtime_->arm_synchronized(num_sync_backwards, 0);
  } else {
    runtime_->arm_local();
  }
}

std::string UnitBuckets::gradient_without_forward(size_t p) const {
  return "ddp: a gradient for parameter '" + names_[p] +
         "' was computed, but no forward of the sharded module ran since the last backward. "
         "Each backward needs its own forward through the wrapper.";
}

int64_t UnitBuckets::gradient_ready(size_t p, const at::Tensor& incoming,
                                    const GradientArrival& arrival) {
  const bool sync = arrival.sync;
  const size_t u = unit_of_param_[p];
  TORCH_CHECK(!filled_[u], "ddp: parameter '", names_[p], "' of unit '", units_[u].name,
              "' got a gradient after the unit's reduce-scatter was issued in this backward (a "
              "second backward through the same forward, or a parameter used again after its "
              "unit's gradients were complete); each parameter takes part in one backward per "
              "forward");
  if (ready_[p]) return -1;
  ready_[p] = true;
  // The bucket's counter says whether p is the unit's last gradient.
  const bool done = runtime_->pending(bucket_of_[u]) == 1;
  if (!sync) {
    runtime_->register_grad_ready(p);
    return done ? static_cast<int64_t>(u) : -1;
  }
  events_.grad_ready(p, /*used=*/true);
  if (!done) {
    runtime_->register_grad_ready(p);  // launches nothing: p's bucket is not complete
    return -1;
  }
  fill_and_register(u, static_cast<int64_t>(member_of_param_[p]), incoming);
  // The engine accumulates `incoming` into this parameter's .grad after this hook.
  stale_grad_ = static_cast<int64_t>(p);
  return static_cast<int64_t>(u);
}

void UnitBuckets::drop_stale_grad() {
  if (stale_grad_ < 0) return;
  params_[static_cast<size_t>(stale_grad_)].mutable_grad() = at::Tensor();
  stale_grad_ = -1;
}

void UnitBuckets::finish_in_flight() {
  while (runtime_->has_in_flight()) {
    const BucketRuntime::Finished finished = runtime_->finish_next();
    // Kept until the end of backward, so shard-sized and its own: a shard that is a view of a
    // full-size temporary would keep every unit's temporary alive to the end (the model's whole
    // gradient size), and one in the reduce input (Gloo reduces in it) would be overwritten by
    // the next unit's fill ([Note: one reduce input]).
    const at::Tensor& shard = finished.shard;
    const bool borrowed =
        shard.defined() &&
        (shard.storage().nbytes() > static_cast<size_t>(shard.nbytes()) ||
         (input_pool_.defined() &&
          shard.storage().unsafeGetStorageImpl() == input_pool_.storage().unsafeGetStorageImpl()));
    shards_[finished.bucket] = borrowed ? shard.clone() : shard;
    comm_done_ns_[finished.bucket] = finished.comm_done_ns;
    inputs_.tensors[finished.bucket] = at::Tensor();  // the input is no longer needed
    if (replicate_) start_cross_replica(finished.bucket);
  }
}

void UnitBuckets::start_cross_replica(size_t b) {
  const comm::ForPurpose purpose(
      {comm::Purpose::kUnitReduce, static_cast<int64_t>(units_[unit_at_[b]].index), plan_epoch_});
  if (!cross_replica_hook_) {
    cross_work_[b] = replicate_->allreduce_avg_async(shards_[b]);
    return;
  }
  const ReduceUnit& unit = units_[unit_at_[b]];
  hooks::GradBucket gb;
  gb.index = events_.first_bucket() + b;
  gb.buffer = shards_[b];
  gb.params = unit.params;
  gb.is_last = b + 1 == plan_.buckets.size();
  gb.iteration = iteration_;
  gb.plan_epoch = plan_epoch_;
  gb.cross_replica = true;
  gb.rank = replicate_->rank();
  gb.world = replicate_->world_size();
  cross_future_[b] = cross_replica_hook_->run(gb);
  TORCH_CHECK(cross_future_[b], "ddp: comm hook '", cross_replica_hook_->name(),
              "' returned no future");
}

void UnitBuckets::finish_cross_replica(size_t b) {
  const std::string& what = cross_what_[b];
  if (cross_work_[b]) {
    replicate_->wait_on_stream(std::move(cross_work_[b]), what);
    cross_work_[b].reset();
    return;
  }
  if (!cross_future_[b]) return;
  auto future = std::move(cross_future_[b]);
  cross_future_[b].reset();
  wait_future(future, replicate_->timeout(), what, replicate_.get());
  const at::Tensor result = future_tensor(future);
  TORCH_CHECK(result.numel() == shards_[b].numel(), "ddp: comm hook '", cross_replica_hook_->name(),
              "' returned ", result.numel(),
              " elements for the cross-replica average of a shard of ", shards_[b].numel());
  if (result.data_ptr() != shards_[b].data_ptr()) shards_[b].copy_(result);
}

at::Tensor UnitBuckets::reduce_input(const ReduceUnit& unit) {
  // [Note: one reduce input] Nothing is in flight here (finish_in_flight ran), so the buffer the
  // previous unit reduced from is free again: every unit of a backward fills the same one, grown
  // when a larger unit comes (the first blocks size it; a large root, last in backward, grows it
  // after the activations are gone). Unless a unit filled earlier still waits for its launch
  // (launches go in plan order, and a backward may complete units in another order: the first
  // step, a tied parameter): then this one gets a buffer of its own.
  const int64_t numel = pg_->world_size() * unit.row_numel;
  if (input_bytes() > 0) return at::empty({numel}, unit.options);
  const bool fits = input_pool_.defined() && input_pool_.numel() >= numel &&
                    input_pool_.scalar_type() == c10::typeMetaToScalarType(unit.options.dtype()) &&
                    input_pool_.device() == unit.options.device();
  if (!fits) {
    input_pool_ = at::Tensor();  // freed before the larger one is made
    input_pool_ = at::empty({numel}, unit.options);
  }
  return input_pool_.narrow(0, 0, numel);
}

void UnitBuckets::fill_and_register(size_t u, int64_t member, const at::Tensor& incoming) {
  // One unit's input at a time: the reductions already launched are finished first.
  finish_in_flight();
  const size_t b = bucket_of_[u];
  const ReduceUnit& unit = units_[u];
  const at::Tensor input = reduce_input(unit);
  {
    at::NoGradGuard no_grad;
    unit.storage->fill_reduce_input(input, member, incoming);
  }
  inputs_.tensors[b] = input;
  filled_[u] = true;
  // The members not yet counted (at the end of backward: all of the unit's missing ones, and
  // the completing member itself); the last one launches the bucket and any complete ones after.
  size_t launched = 0;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    if (static_cast<int64_t>(i) == member || !ready_[first_param_[u] + i]) {
      launched += runtime_->register_grad_ready(first_param_[u] + i);
    }
  }
  if (launched > 0) events_.launched(runtime_->launched(), launched);
}

void UnitBuckets::finish_backward(int64_t /*num_sync_backwards*/) {
  drop_stale_grad();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const size_t u = unit_at_[b];
    if (filled_[u]) continue;
    for (size_t i = 0; i < units_[u].params.size(); ++i) {
      const size_t p = first_param_[u] + i;
      if (!ready_[p]) events_.grad_ready(p, /*used=*/false);
    }
    fill_and_register(u, -1, at::Tensor());
  }
  finish_in_flight();
  input_pool_ = at::Tensor();  // between steps a rank holds its shards only
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    if (replicate_) finish_cross_replica(b);
    units_[unit_at_[b]].storage->finish_reduce_scatter(shards_[b]);
    shards_[b] = at::Tensor();
    events_.finished(b, plan_.buckets[b].params, comm_done_ns_[b]);
  }
}

void UnitBuckets::reset() {
  stale_grad_ = -1;
  ready_.assign(params_.size(), false);
  filled_.assign(units_.size(), false);
  if (runtime_) runtime_->reset();
  for (auto& t : inputs_.tensors) t = at::Tensor();
  for (auto& t : shards_) t = at::Tensor();
  for (auto& w : cross_work_) w.reset();
  for (auto& f : cross_future_) f.reset();
  input_pool_ = at::Tensor();
}

}  // namespace ddp::gradients
