// The second half of a synchronized backward: waiting for bucket reductions, writing the averaged
// gradients back, the optimizer in backward, the end-of-backward checks and the post-iteration-1
// rebuild. Also join's shadow backward, which issues the same collectives with zeros.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <sstream>

#include "ddp/reducer/reducer_runtime.hpp"
#include "same_view.hpp"

namespace ddp::reducer {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  return out.str();
}

at::Tensor future_tensor(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  const c10::IValue& value = future->value();
  if (value.isTensor()) return value.toTensor();
  return value.toTensorVector().at(0);
}

std::string bucket_what(size_t b, const buckets::Bucket& spec) {
  return "reduction of gradient bucket " + std::to_string(b) + " (" +
         std::to_string(spec.params.size()) + " parameters, " + std::to_string(spec.bytes) +
         " bytes)";
}

}  // namespace

bool Reducer::bucket_completed(size_t b) const {
  const BucketState& bucket = buckets_[b];
  // A CUDA future is completed as soon as its work is enqueued, so it cannot say whether the
  // device finished; such buckets are finished at the end of backward (see [Note: streams]).
  // Work::isCompleted on NCCL polls the collective's end event.
  if (bucket.future) return !on_device_ && bucket.future->completed();
  return bucket.work && bucket.work->isCompleted();
}

void Reducer::wait_used_map() {
  if (used_map_ready_) return;
  pg_->wait(used_work_, "all-reduce of the used-parameter map");
  const at::Tensor global = used_buffer_.cpu();
  for (size_t p = 0; p < params_.size(); ++p) globally_used_[p] = global.data_ptr<int>()[p] > 0;
  used_work_.reset();
  used_map_ready_ = true;
}

void Reducer::finish_completed_buckets() {
  // Early finish (optimizer in backward): only buckets already reduced, in order, so no wait here
  // blocks the autograd thread.
  if (!used_map_ready_ && !(used_work_ && used_work_->isCompleted())) return;
  while (next_to_finish_ < next_bucket_ && bucket_completed(next_to_finish_)) {
    finish(next_to_finish_++);
  }
}

void Reducer::finish(size_t b) {
  BucketState& bucket = buckets_[b];
  const buckets::Bucket& spec = plan_.buckets[b];
  at::Tensor sparse_result;
  if (bucket.future) {
    wait_future(bucket.future, pg_->timeout(),
                bucket_what(b, spec) + " by comm hook '" + hook_->name() + "'", pg_.get());
    const at::Tensor result = future_tensor(bucket.future);
    TORCH_CHECK(result.numel() == bucket.buffer.numel(), "ddp: comm hook '", hook_->name(),
                "' returned ", result.numel(), " elements for bucket ", b, " of ",
                bucket.buffer.numel());
    if (result.data_ptr() != bucket.buffer.data_ptr()) {
      at::NoGradGuard no_grad;
      bucket.buffer.copy_(result);
    }
    bucket.future.reset();
  } else {
    pg_->wait_on_stream(bucket.work, bucket_what(b, spec));
    if (spec.sparse) sparse_result = bucket.work->result().at(0);
    bucket.work.reset();
  }
  wait_used_map();
  at::NoGradGuard no_grad;
  for (size_t p : spec.params) {
    at::Tensor& grad = params_[p].mutable_grad();
    if (!globally_used_[p]) {
      // As PyTorch: a parameter no rank used keeps the gradient it had (undefined stays undefined).
      if (saved_unused_grads_[p].defined()) {
        if (spec.sparse) {
          grad = saved_unused_grads_[p];
        } else if (same_view(grad, slots_[p])) {
          grad.copy_(saved_unused_grads_[p]);
        }
      }
      continue;
    }
    if (spec.sparse) {
      grad = sparse_result;
    } else if (options_.gradient_as_bucket_view) {
      if (!same_view(grad, slots_[p])) grad = slots_[p];
    } else if (grad.defined()) {
      grad.copy_(slots_[p]);
    } else {
      grad = slots_[p].clone();
    }
  }
  bucket.sparse.reset();
  bucket.finished = true;
  if (!timeline_.bucket_done_ns.empty()) {
    timeline_.bucket_done_ns[b] = now_ns() - timeline_.backward_start_ns;
    if (bucket.comm_done_ns) timeline_.bucket_comm_done_ns[b] = bucket.comm_done_ns->load();
  }
  if (!param_optimizers_.empty()) {
    // The optimizer in backward: these parameters' gradients are final, and no later backward
    // node reads their values (a gradient is ready only after all its uses were differentiated).
    for (size_t p : spec.params) {
      if (params_[p].grad().defined()) param_optimizers_[p]->step();
    }
  }
}

void Reducer::finalize_backward() {
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
  for (; next_to_finish_ < next_bucket_; ++next_to_finish_) {
    try {
      finish(next_to_finish_);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (!failure) {
    try {
      wait_used_map();
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
  if (options_.static_graph && num_sync_backwards_ == 0) {
    static_unused_.assign(params_.size(), false);
    for (size_t p = 0; p < params_.size(); ++p) static_unused_[p] = !reachable_[p];
    static_globally_used_ = globally_used_;
  }
  ++num_sync_backwards_;
  timeline_.finalize_ns = now_ns() - timeline_.backward_start_ns;
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

void Reducer::reset_iteration() {
  state_ = State::kIdle;
  next_bucket_ = 0;
  next_to_finish_ = 0;
  divisor_ = 0;
  ready_.assign(params_.size(), false);
  reachable_.assign(params_.size(), true);
  for (auto& g : saved_unused_grads_) g.reset();
  for (auto& b : buckets_) {
    b.work.reset();
    b.future.reset();
    b.sparse.reset();
  }
  used_work_.reset();
  locally_used_.zero_();
}

void Reducer::shadow_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kIdle, "ddp: join's shadow backward in state ", state_name(state_));
  hooks_frozen_ = true;
  at::NoGradGuard no_grad;
  // The same collectives, in the same order, as begin_sync_backward and the bucket launches.
  const bool map =
      options_.find_unused_parameters || (options_.static_graph && num_sync_backwards_ == 0);
  if (map) {
    locally_used_.zero_();
    if (on_device_) used_buffer_.zero_();
    pg_->wait(pg_->allreduce_sum_async(used_buffer_), "join: all-reduce of the used-parameter map");
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    TORCH_CHECK(!plan_.buckets[b].sparse,
                "ddp: join does not support sparse gradients (parameter '",
                names_[plan_.buckets[b].params[0]], "')");
    buckets_[b].buffer.zero_();
    launch(b);
    if (buckets_[b].future) {
      wait_future(buckets_[b].future, pg_->timeout(),
                  "join: shadow " + bucket_what(b, plan_.buckets[b]), pg_.get());
      buckets_[b].future.reset();
    } else {
      pg_->wait(buckets_[b].work, "join: shadow " + bucket_what(b, plan_.buckets[b]));
      buckets_[b].work.reset();
    }
  }
  locally_used_.zero_();
}

IterationTimeline Reducer::last_timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

}  // namespace ddp::reducer
