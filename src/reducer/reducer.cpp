#include "ddp/reducer/reducer.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <sstream>

#include "ddp/reducer/graph_walk.hpp"

namespace ddp::reducer {

// Runs after the accumulator has written the parameter's .grad: the gradient is final for this
// backward (the engine sums all uses of a parameter before its accumulator runs).
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Reducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->on_grad_ready(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;  // outlives the hook: ~Reducer removes every hook first
  size_t index_;
};

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  return out.str();
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
}

}  // namespace

const char* Reducer::state_name(State s) {
  switch (s) {
    case State::kIdle:
      return "idle";
    case State::kPreparedSync:
      return "prepared (synchronized)";
    case State::kPreparedLocal:
      return "prepared (no_sync)";
    case State::kBackwardSync:
      return "in backward (synchronized)";
    case State::kBackwardLocal:
      return "in backward (no_sync)";
  }
  return "?";
}

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 comm::ProcessGroupPtr process_group, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(process_group)),
      options_(options) {
  TORCH_CHECK(pg_, "ddp: Reducer needs a process group");
  TORCH_CHECK(params_.size() == names_.size(), "ddp: ", params_.size(), " parameters but ",
              names_.size(), " names");
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    TORCH_CHECK(p.requires_grad() && p.is_leaf(), "ddp: parameter '", names_[i],
                "' must be a leaf that requires grad");
    specs_.push_back({names_[i], p.numel(), p.scalar_type(), p.device(), false});
  }
  buckets::PlanOptions plan_options;
  plan_options.first_bucket_cap_bytes = options_.first_bucket_cap_bytes;
  plan_options.bucket_cap_bytes = options_.bucket_cap_bytes;
  plan_ = buckets::plan_buckets(specs_, plan_options);

  at::NoGradGuard no_grad;
  buckets_.resize(plan_.buckets.size());
  slots_.resize(params_.size());
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const buckets::Bucket& spec = plan_.buckets[b];
    buckets_[b].buffer =
        at::zeros({spec.numel}, at::TensorOptions().dtype(spec.dtype).device(spec.device));
    const at::Tensor& buffer = buckets_[b].buffer;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const size_t p = spec.params[i];
      at::Tensor slot = at::empty({0}, buffer.options());
      slot.set_(buffer.storage(), buffer.storage_offset() + spec.offsets[i], params_[p].sizes(),
                c10::contiguous_strides(params_[p].sizes()));
      slots_[p] = slot;
      // A gradient the parameter already holds moves into the bucket, so it is not lost.
      at::Tensor& grad = params_[p].mutable_grad();
      if (options_.gradient_as_bucket_view && grad.defined()) {
        slot.copy_(grad);
        grad = slot;
      }
    }
  }

  ready_.assign(params_.size(), false);
  reachable_.assign(params_.size(), true);
  saved_unused_grads_.resize(params_.size());
  locally_used_ = at::zeros({static_cast<int64_t>(params_.size())}, at::kInt);

  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    TORCH_CHECK(acc, "ddp: parameter '", names_[i], "' has no gradient accumulator");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(this, i)));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

int64_t Reducer::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

at::Tensor& Reducer::grad_of(size_t index) { return params_[index].mutable_grad(); }

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  if (options_.find_unused_parameters) reachable_ = reachable_params(outputs, params_);
  state_ = State::kPreparedSync;
}

void Reducer::prepare_for_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  state_ = State::kPreparedLocal;
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kIdle, "ddp: a gradient for parameter '", names_[index],
              "' was computed, but no forward of the DistributedDataParallel module ran since "
              "the last backward. Each backward needs its own forward (backward twice through "
              "one graph, e.g. with retain_graph, is not supported).");
  auto& engine = torch::autograd::Engine::get_default_engine();
  switch (state_) {
    case State::kIdle:
      break;  // excluded above
    case State::kPreparedLocal:
      state_ = State::kBackwardLocal;
      engine.queue_callback([this] {
        std::lock_guard<std::mutex> lock(mutex_);
        state_ = State::kIdle;
      });
      [[fallthrough]];
    case State::kBackwardLocal:
      locally_used_.data_ptr<int>()[index] = 1;
      return;
    case State::kPreparedSync: {
      state_ = State::kBackwardSync;
      engine.queue_callback([this] { finalize_backward(); });
      timeline_ = IterationTimeline{};
      timeline_.backward_start_ns = now_ns();
      timeline_.param_ready_ns.assign(params_.size(), -1);
      timeline_.bucket_launch_ns.assign(buckets_.size(), -1);
      timeline_.bucket_done_ns.assign(buckets_.size(), -1);
      for (size_t b = 0; b < buckets_.size(); ++b) {
        buckets_[b].pending = plan_.buckets[b].params.size();
      }
      if (options_.find_unused_parameters) {
        // Every rank issues this collective at the same point (first gradient), before any bucket.
        for (size_t p = 0; p < params_.size(); ++p) {
          if (reachable_[p]) locally_used_.data_ptr<int>()[p] = 1;
        }
        // The map lives on the CPU; NCCL needs it on the parameters' device.
        used_buffer_ = params_[0].is_cuda() ? locally_used_.to(params_[0].device()) : locally_used_;
        used_work_ = pg_->allreduce_sum_async(used_buffer_);
        for (size_t p = 0; p < params_.size(); ++p) {
          if (!reachable_[p]) mark_ready(p, /*used=*/false);
        }
      }
      break;
    }
    case State::kBackwardSync:
      break;
  }
  TORCH_CHECK(reachable_[index], "ddp: parameter '", names_[index],
              "' got a gradient although the forward outputs do not depend on it; the loss must be "
              "computed from the outputs of the DistributedDataParallel module.");
  TORCH_CHECK(!ready_[index], "ddp: parameter '", names_[index],
              "' became ready twice in one backward. A parameter may take part in one "
              "synchronized backward per forward; reentrant backward is not supported.");
  mark_ready(index, /*used=*/true);
}

void Reducer::mark_ready(size_t index, bool used) {
  ready_[index] = true;
  timeline_.param_ready_ns[index] = used ? now_ns() - timeline_.backward_start_ns : -1;
  at::Tensor& grad = grad_of(index);
  at::Tensor& slot = slots_[index];
  at::NoGradGuard no_grad;
  if (grad.defined()) {
    TORCH_CHECK(!grad.is_sparse(), "ddp: parameter '", names_[index],
                "' has a sparse gradient; sparse gradients are not supported by this Reducer yet");
    if (!used) saved_unused_grads_[index] = grad.clone();
    if (options_.gradient_as_bucket_view) {
      // After zero_grad(set_to_none) the accumulator made a fresh tensor: move it into the bucket.
      if (!same_view(grad, slot)) {
        slot.copy_(grad);
        grad = slot;
      }
    } else {
      slot.copy_(grad);
    }
  } else {
    // Only an unused parameter can be here; it contributes zero.
    slot.zero_();
  }
  const size_t b = plan_.bucket_of[index];
  TORCH_CHECK(buckets_[b].pending > 0, "ddp: bucket ", b, " over-counted (parameter '",
              names_[index], "')");
  if (--buckets_[b].pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Strict plan order: a full bucket waits for the buckets before it, so every rank issues the
  // same collectives in the same order even when gradients arrive in different orders.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(next_bucket_++);
  }
}

void Reducer::launch(size_t b) {
  BucketState& bucket = buckets_[b];
  timeline_.bucket_launch_ns[b] = now_ns() - timeline_.backward_start_ns;
  // Divide before summing: the sum of averages stays in range for low-precision dtypes.
  bucket.buffer.div_(pg_->world_size());
  bucket.work = pg_->allreduce_sum_async(bucket.buffer);
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ == State::kBackwardSync, "ddp: end of backward in unexpected state ",
              state_name(state_));
  std::vector<std::string> missing;
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!ready_[p]) missing.push_back(names_[p]);
  }
  // Wait for what was launched even on the error path: the collectives are already matched with
  // the other ranks' and must not be left half-done.
  std::exception_ptr failure;
  for (size_t b = 0; b < next_bucket_; ++b) {
    try {
      pg_->wait(buckets_[b].work, "all-reduce of gradient bucket " + std::to_string(b) + " (" +
                                      std::to_string(plan_.buckets[b].params.size()) +
                                      " parameters, " + std::to_string(plan_.buckets[b].bytes) +
                                      " bytes)");
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    buckets_[b].work.reset();
    timeline_.bucket_done_ns[b] = now_ns() - timeline_.backward_start_ns;
  }
  at::Tensor globally_used;
  if (used_work_) {
    try {
      pg_->wait(used_work_, "all-reduce of the used-parameter map");
      globally_used = used_buffer_.cpu();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    used_work_.reset();
  }
  if (failure || !missing.empty()) {
    reset_iteration();
    if (failure) std::rethrow_exception(failure);
    TORCH_CHECK(false, "ddp: ", missing.size(),
                " parameter(s) received no gradient in this backward: ", join_names(missing),
                ". Their buckets could not be reduced. If these parameters are not used in every "
                "forward, construct DistributedDataParallel with find_unused_parameters = true; "
                "if they never take part, set requires_grad to false or remove them.");
  }

  at::NoGradGuard no_grad;
  for (size_t p = 0; p < params_.size(); ++p) {
    at::Tensor& grad = grad_of(p);
    const bool unused_everywhere = globally_used.defined() && globally_used.data_ptr<int>()[p] == 0;
    if (unused_everywhere) {
      // As PyTorch: a parameter no rank used keeps the gradient it had (undefined stays undefined).
      if (saved_unused_grads_[p].defined()) {
        if (same_view(grad, slots_[p])) grad.copy_(saved_unused_grads_[p]);
      }
      continue;
    }
    if (options_.gradient_as_bucket_view) {
      if (!same_view(grad, slots_[p])) grad = slots_[p];
    } else if (grad.defined()) {
      grad.copy_(slots_[p]);
    } else {
      grad = slots_[p].clone();
    }
  }
  ++num_sync_backwards_;
  timeline_.finalize_ns = now_ns() - timeline_.backward_start_ns;
  reset_iteration();
}

void Reducer::reset_iteration() {
  state_ = State::kIdle;
  next_bucket_ = 0;
  ready_.assign(params_.size(), false);
  reachable_.assign(params_.size(), true);
  for (auto& g : saved_unused_grads_) g.reset();
  for (auto& b : buckets_) b.work.reset();
  locally_used_.zero_();
}

IterationTimeline Reducer::last_timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

}  // namespace ddp::reducer
