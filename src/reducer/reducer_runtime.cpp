#include "ddp/reducer/reducer_runtime.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <condition_variable>

#include "ddp/buckets/bucket_table.hpp"
#include "ddp/planner/reachability.hpp"
#include "same_view.hpp"

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

void wait_future(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                 std::chrono::milliseconds timeout, const std::string& what,
                 const comm::ProcessGroup* pg) {
  struct Signal {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto signal = std::make_shared<Signal>();
  future->addCallback([signal](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(signal->mutex);
    signal->done = true;
    signal->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(signal->mutex);
  const bool done = signal->cv.wait_for(lock, timeout, [&] { return signal->done; });
  TORCH_CHECK(done, "ddp: ", what, " did not complete within the collective timeout (",
              timeout.count(),
              " ms; another rank may have died, hung, or issued different collectives",
              pg ? pg->progress_report() : std::string(), ")");
  if (future->hasError()) {
    try {
      std::rethrow_exception(future->exception_ptr());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "ddp: ", what, " failed (collective timeout ", timeout.count(), " ms",
                  pg ? pg->progress_report() : std::string(), "): ", e.what());
    }
  }
  // Completed: on the CPU this returns at once; a CUDA future completes when its work is enqueued,
  // and wait() then makes the current streams wait on its events (no host wait).
  future->wait();
}

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
                 comm::ProcessGroupPtr process_group, ReducerOptions options,
                 std::vector<bool> expect_sparse)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(process_group)),
      options_(options) {
  TORCH_CHECK(pg_, "ddp: Reducer needs a process group");
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
  reachable_.assign(params_.size(), true);
  globally_used_.assign(params_.size(), true);
  saved_unused_grads_.resize(params_.size());
  on_device_ = !params_.empty() && params_[0].is_cuda();
  const auto used_count = static_cast<int64_t>(params_.size());
  // Pinned, so the copy to the device at each synchronized backward is asynchronous.
  locally_used_ = at::zeros({used_count}, at::TensorOptions(at::kInt).pinned_memory(on_device_));
  used_buffer_ =
      on_device_ ? at::zeros({used_count}, params_[0].options().dtype(at::kInt)) : locally_used_;
  build_plan(buckets::reverse_registration_order(params_.size()));
  num_plan_changes_ = 0;  // the initial plan is not a change

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

void Reducer::register_comm_hook(hooks::CommHookPtr hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(hook, "ddp: register_comm_hook needs a hook");
  TORCH_CHECK(!hooks_frozen_, "ddp: register_comm_hook must be called before the first backward");
  TORCH_CHECK(!hook_, "ddp: a comm hook ('", hook_->name(),
              "') is already registered; register_comm_hook may be called once");
  hook_ = std::move(hook);
}

void Reducer::set_optimizer_in_backward(const ParamOptimizerFactory& factory) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(factory, "ddp: set_optimizer_in_backward needs an optimizer factory");
  TORCH_CHECK(!hooks_frozen_,
              "ddp: set_optimizer_in_backward must be called before the first backward");
  TORCH_CHECK(param_optimizers_.empty(), "ddp: the optimizer in backward is already set");
  for (const auto& p : params_) {
    param_optimizers_.push_back(factory(p));
    TORCH_CHECK(param_optimizers_.back(), "ddp: the optimizer factory returned null");
  }
}

std::string Reducer::comm_hook_name() const { return hook_ ? hook_->name() : "allreduce"; }

void Reducer::on_plan_change(std::function<void(const std::string&)> callback) {
  plan_callback_ = std::move(callback);
}

int64_t Reducer::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Reducer::build_plan(const std::vector<size_t>& order) {
  buckets::PlanOptions plan_options;
  plan_options.first_bucket_cap_bytes = options_.first_bucket_cap_bytes;
  plan_options.bucket_cap_bytes = options_.bucket_cap_bytes;
  plan_options.order = order;
  plan_ = buckets::plan_buckets(specs_, plan_options);
  plan_order_ = order;

  at::NoGradGuard no_grad;
  std::vector<BucketState> fresh(plan_.buckets.size());
  std::vector<at::Tensor> slots(params_.size());
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const buckets::Bucket& spec = plan_.buckets[b];
    if (spec.sparse) continue;
    fresh[b].buffer =
        at::zeros({spec.numel}, at::TensorOptions().dtype(spec.dtype).device(spec.device));
    const at::Tensor& buffer = fresh[b].buffer;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const size_t p = spec.params[i];
      at::Tensor slot = at::empty({0}, buffer.options());
      slot.set_(buffer.storage(), buffer.storage_offset() + spec.offsets[i], params_[p].sizes(),
                c10::contiguous_strides(params_[p].sizes()));
      slots[p] = slot;
      // A gradient the parameter already holds (from before, or in an old bucket) moves into the
      // new bucket, so nothing accumulated is lost.
      at::Tensor& grad = params_[p].mutable_grad();
      if (options_.gradient_as_bucket_view && grad.defined() && !grad.is_sparse()) {
        slot.copy_(grad);
        grad = slot;
      }
    }
  }
  buckets_ = std::move(fresh);
  slots_ = std::move(slots);
  ++num_plan_changes_;
  if (plan_callback_) plan_callback_(buckets::format_bucket_table(plan_, specs_));
}

std::vector<size_t> Reducer::complete_order(const std::vector<size_t>& partial) const {
  // Parameters missing from `partial` (unused in that iteration) go last, in reverse
  // registration order, as PyTorch's rebuild does.
  std::vector<bool> seen(params_.size(), false);
  std::vector<size_t> order;
  for (size_t p : partial) {
    if (p < params_.size() && !seen[p]) {
      seen[p] = true;
      order.push_back(p);
    }
  }
  for (size_t i = params_.size(); i-- > 0;) {
    if (!seen[i]) order.push_back(i);
  }
  return order;
}

std::vector<size_t> Reducer::agree_on_order(std::vector<size_t> order, const std::string& what) {
  // Rank 0's order wins: data-dependent control flow could make ranks see different orders,
  // and buckets must be identical everywhere.
  if (pg_->world_size() == 1 || order.empty()) return order;
  at::Tensor t = at::empty({static_cast<int64_t>(order.size())}, at::kLong);
  for (size_t i = 0; i < order.size(); ++i)
    t.data_ptr<int64_t>()[i] = static_cast<int64_t>(order[i]);
  if (params_[0].is_cuda()) t = t.to(params_[0].device());
  pg_->broadcast(t, 0, what);
  t = t.cpu();
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = static_cast<size_t>(t.data_ptr<int64_t>()[i]);
  return order;
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  const bool first_iteration = num_sync_backwards_ == 0;
  const bool walk = options_.find_unused_parameters || (options_.static_graph && first_iteration);
  if (walk) reachable_ = planner::reachable_params(outputs, params_);
  planned_ = true;  // from now on only the post-iteration-1 rebuild may change the plan
  forward_end_ns_ = now_ns();
  state_ = State::kPreparedSync;
}

void Reducer::set_predicted_order(const std::vector<size_t>& predicted) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!planned_, "ddp: the predicted order must be set before the first backward");
  planned_ = true;
  rebuilt_ = true;  // predicted from the graph: no rebuild after iteration 1
  if (params_.empty()) return;
  auto order = agree_on_order(complete_order(predicted), "broadcast of the predicted bucket order");
  if (order != plan_order_) build_plan(order);
}

void Reducer::prepare_for_local_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kBackwardSync && state_ != State::kBackwardLocal,
              "ddp: forward called while a backward is running (state: ", state_name(state_), ")");
  state_ = State::kPreparedLocal;
}

void Reducer::set_divisor_for_next_backward(int64_t divisor) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(divisor >= 1, "ddp: gradient divisor must be at least 1, got ", divisor);
  divisor_ = divisor;
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(state_ != State::kIdle, "ddp: a gradient for parameter '", names_[index],
              "' was computed, but no forward of the DistributedDataParallel module ran since "
              "the last backward. Each backward needs its own forward (backward twice through "
              "one graph, e.g. with retain_graph, is not supported).");
  hooks_frozen_ = true;
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
    case State::kPreparedSync:
      begin_sync_backward();
      break;
    case State::kBackwardSync:
      break;
  }
  if (options_.static_graph && num_sync_backwards_ > 0) {
    TORCH_CHECK(!static_unused_[index], "ddp: static_graph is set, but parameter '", names_[index],
                "' got a gradient in iteration ", num_sync_backwards_ + 1,
                " although it was unused in the first iteration: the graph changed. Use "
                "find_unused_parameters instead of static_graph for a graph that changes.");
  }
  TORCH_CHECK(reachable_[index], "ddp: parameter '", names_[index],
              "' got a gradient although the forward outputs do not depend on it; the loss must be "
              "computed from the outputs of the DistributedDataParallel module.");
  TORCH_CHECK(!ready_[index], "ddp: parameter '", names_[index],
              "' became ready twice in one backward. A parameter may take part in one "
              "synchronized backward per forward; reentrant backward is not supported.");
  observed_order_.push_back(index);
  mark_ready(index, /*used=*/true);
  if (!param_optimizers_.empty()) finish_completed_buckets();
}

void Reducer::begin_sync_backward() {
  state_ = State::kBackwardSync;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
  timeline_ = IterationTimeline{};
  timeline_.iteration = num_sync_backwards_ + 1;
  timeline_.backward_start_ns = forward_end_ns_;
  timeline_.param_ready_ns.assign(params_.size(), -1);
  timeline_.bucket_launch_ns.assign(buckets_.size(), -1);
  timeline_.bucket_done_ns.assign(buckets_.size(), -1);
  timeline_.bucket_comm_done_ns.assign(buckets_.size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = plan_.buckets[b].params.size();
    buckets_[b].finished = false;
  }
  observed_order_.clear();
  const bool first_iteration = num_sync_backwards_ == 0;
  std::vector<bool> unused(params_.size(), false);
  if (options_.static_graph && !first_iteration) {
    // Recorded in iteration 1: no walk, no used-map collective.
    unused = static_unused_;
    globally_used_ = static_globally_used_;
    used_map_ready_ = true;
  } else if (options_.find_unused_parameters || options_.static_graph) {
    for (size_t p = 0; p < params_.size(); ++p) {
      unused[p] = !reachable_[p];
      if (reachable_[p]) locally_used_.data_ptr<int>()[p] = 1;
    }
    // Every rank issues this collective at the same point (first gradient), before any bucket.
    // The map lives on the CPU; NCCL needs it on the parameters' device.
    if (on_device_) used_buffer_.copy_(locally_used_, /*non_blocking=*/true);
    used_work_ = pg_->allreduce_sum_async(used_buffer_);
    used_map_ready_ = false;
  } else {
    globally_used_.assign(params_.size(), true);
    used_map_ready_ = true;
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    if (unused[p]) mark_ready(p, /*used=*/false);
  }
}

void Reducer::mark_ready(size_t index, bool used) {
  ready_[index] = true;
  timeline_.param_ready_ns[index] = used ? now_ns() - timeline_.backward_start_ns : -1;
  at::Tensor& grad = params_[index].mutable_grad();
  const size_t b = plan_.bucket_of[index];
  at::NoGradGuard no_grad;
  if (specs_[index].sparse) {
    TORCH_CHECK(!grad.defined() || grad.is_sparse(), "ddp: parameter '", names_[index],
                "' was declared sparse but its gradient is dense");
    if (!used) saved_unused_grads_[index] = grad.defined() ? grad.clone() : at::Tensor();
    buckets_[b].sparse =
        grad.defined() ? grad.coalesce()
                       : at::zeros(params_[index].sizes(), params_[index].options()).to_sparse();
  } else {
    at::Tensor& slot = slots_[index];
    if (grad.defined()) {
      TORCH_CHECK(!grad.is_sparse(), "ddp: parameter '", names_[index],
                  "' has a sparse gradient, but its module did not declare sparse gradients "
                  "(torch::nn::Embedding with sparse(true) is detected)");
      if (!used) saved_unused_grads_[index] = grad.clone();
      if (options_.gradient_as_bucket_view) {
        // After zero_grad(set_to_none) the accumulator made a fresh tensor: move it into the
        // bucket and make the bucket the gradient again.
        if (!same_view(grad, slot)) {
          slot.copy_(grad);
          grad = slot;
        }
      } else {
        slot.copy_(grad);
      }
    } else {
      slot.zero_();  // only an unused parameter can be here; it contributes zero
    }
  }
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

hooks::GradBucket Reducer::grad_bucket(size_t b) {
  const buckets::Bucket& spec = plan_.buckets[b];
  hooks::GradBucket gb;
  gb.index = b;
  gb.buffer = buckets_[b].buffer;
  gb.offsets = spec.offsets;
  for (size_t p : spec.params) {
    gb.params.push_back(params_[p]);
    gb.lengths.push_back(params_[p].numel());
  }
  gb.is_last = b + 1 == buckets_.size();
  gb.iteration = num_sync_backwards_;
  return gb;
}

void Reducer::launch(size_t b) {
  BucketState& bucket = buckets_[b];
  if (!timeline_.bucket_launch_ns.empty()) {
    timeline_.bucket_launch_ns[b] = now_ns() - timeline_.backward_start_ns;
  }
  const int64_t divisor = divisor_ > 0 ? divisor_ : pg_->world_size();
  if (plan_.buckets[b].sparse) {
    // Sparse gradients travel as (indices, values); Gloo's sparse all-reduce returns a new tensor.
    bucket.sparse = bucket.sparse.div(divisor);
    bucket.work = pg_->allreduce_sum_async(bucket.sparse);
    watch_completion(b, bucket.work->getFuture());
  } else if (hook_) {
    hooks::GradBucket gb = grad_bucket(b);
    bucket.future = hook_->run(gb);
    TORCH_CHECK(bucket.future, "ddp: comm hook '", hook_->name(), "' returned no future");
    watch_completion(b, bucket.future);
  } else if (divisor == pg_->world_size()) {
    // NCCL averages inside the reduction; elsewhere this divides first (the sum of averages stays
    // in range for low-precision dtypes).
    bucket.work = pg_->allreduce_avg_async(bucket.buffer);
    watch_completion(b, bucket.work->getFuture());
  } else {
    bucket.buffer.div_(divisor);  // join: only the ranks still training count
    bucket.work = pg_->allreduce_sum_async(bucket.buffer);
    watch_completion(b, bucket.work->getFuture());
  }
}

void Reducer::watch_completion(size_t b, const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  // Stats only: when the communication itself ended (finish() may run much later).
  auto done = std::make_shared<std::atomic<int64_t>>(-1);
  buckets_[b].comm_done_ns = done;
  // A CUDA future completes when its work is enqueued, not when the device ran it: a host
  // timestamp from its callback would be the launch time again. Left unknown (-1) on the GPU,
  // where a device profiler gives the real spans.
  if (on_device_) return;
  const int64_t start = timeline_.backward_start_ns;
  future->addCallback([done, start](c10::ivalue::Future&) {
    done->store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count() -
                start);
  });
}

}  // namespace ddp::reducer
