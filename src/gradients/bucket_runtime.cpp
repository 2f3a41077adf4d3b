#include "ddp/gradients/bucket_runtime.hpp"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/obs/timeline.hpp"

namespace ddp::gradients {

using buckets::Reduction;

at::Tensor future_tensor(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  const c10::IValue& value = future->value();
  if (value.isTensor()) return value.toTensor();
  return value.toTensorVector().at(0);
}

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

BucketRuntime::BucketRuntime(const std::vector<at::Tensor>& params, const buckets::BucketPlan& plan,
                             buckets::BucketBuffers& buffers, comm::ProcessGroupPtr pg,
                             hooks::CommHookPtr hook, int64_t plan_epoch, size_t first_index)
    : params_(params),
      plan_(plan),
      buffers_(buffers),
      pg_(std::move(pg)),
      hook_(std::move(hook)),
      plan_epoch_(plan_epoch),
      first_index_(first_index),
      buckets_(plan.buckets.size()) {
  TORCH_CHECK(pg_, "ddp: BucketRuntime needs a process group");
  TORCH_CHECK(buffers_.num_buckets() == plan_.buckets.size(),
              "ddp: BucketRuntime: the bucket buffers have ", buffers_.num_buckets(),
              " buckets, the plan ", plan_.buckets.size());
  on_device_ = !plan_.buckets.empty() && plan_.buckets[0].device.is_cuda();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    TORCH_CHECK(!plan_.buckets[b].sparse || plan_.buckets[b].reduction == Reduction::kAllReduce,
                "ddp: a reduce-scatter reduction cannot reduce the sparse bucket ", b,
                "; sparse gradients are all-reduced");
  }
  for (size_t b = 0; b < plan_.buckets.size(); ++b) what_.push_back(describe(b));
}

std::string BucketRuntime::describe(size_t b) const {
  const buckets::Bucket& spec = plan_.buckets[b];
  std::string text = "reduction of gradient bucket " + std::to_string(b) + " (" +
                     std::to_string(spec.params.size()) + " parameters, " +
                     std::to_string(spec.bytes) + " bytes)";
  if (hook_ && !spec.sparse) text += " by comm hook '" + hook_->name() + "'";
  return text;
}

void BucketRuntime::arm_synchronized(int64_t iteration, int64_t divisor) {
  arm(/*local=*/false);
  iteration_ = iteration;
  divisor_ = divisor;
}

void BucketRuntime::arm_local() { arm(/*local=*/true); }

void BucketRuntime::arm(bool local) {
  TORCH_CHECK(in_flight_.empty(), "ddp: a ", local ? "local" : "synchronized",
              " backward started with ", in_flight_.size(),
              " bucket(s) of the previous one unfinished");
  local_ = local;
  next_launch_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) buckets_[b].pending = plan_.buckets[b].params.size();
}

size_t BucketRuntime::register_grad_ready(size_t param) {
  const size_t b = plan_.bucket_of[param];
  // The reducer marks each parameter ready at most once per backward; a second mark is a bug there.
  TORCH_CHECK(buckets_[b].pending > 0, "ddp: parameter ", param, " of bucket ", b,
              " was reported ready after every parameter of that bucket was");
  if (--buckets_[b].pending != 0 || local_) return 0;
  // Strict plan order: a full bucket waits for the buckets before it, so every rank issues the
  // same collectives in the same order even when gradients arrive in different orders.
  size_t launched = 0;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(next_launch_++);
    ++launched;
  }
  return launched;
}

hooks::GradBucket BucketRuntime::grad_bucket(size_t b) const {
  const buckets::Bucket& spec = plan_.buckets[b];
  hooks::GradBucket gb;
  gb.index = first_index_ + b;
  gb.buffer = buffers_.data(b);
  gb.offsets = spec.offsets;
  gb.lengths = spec.lengths;
  for (size_t p : spec.params) gb.params.push_back(params_[p]);
  if (spec.reduction == Reduction::kReduceScatter) {
    gb.reduce_scatter = true;
    gb.rank = pg_->rank();
    gb.world = pg_->world_size();
  }
  gb.is_last = b + 1 == buckets_.size();
  gb.iteration = iteration_;
  gb.plan_epoch = plan_epoch_;
  return gb;
}

void BucketRuntime::launch(size_t b) {
  RECORD_USER_SCOPE("ddp::reduce_bucket");
  const bool scatter = plan_.buckets[b].reduction == Reduction::kReduceScatter;
  // A unit's reduction is named by its unit index, as its gathers are; a DDP bucket by its number.
  const comm::ForPurpose purpose(
      {scatter ? comm::Purpose::kUnitReduce : comm::Purpose::kBucket,
       static_cast<int64_t>(scatter ? plan_.buckets[b].unit : first_index_ + b), plan_epoch_});
  BucketState& bucket = buckets_[b];
  const int64_t divisor = divisor_ > 0 ? divisor_ : pg_->world_size();
  const bool dense = !plan_.buckets[b].sparse;
  // [Note: in-place reduction]: only the built-in average of an all-reduced bucket.
  std::vector<at::Tensor> in_place;
  if (dense && !hook_ && divisor == pg_->world_size() &&
      plan_.buckets[b].reduction == Reduction::kAllReduce) {
    in_place = buffers_.take_whole_staged(b);
  }
  bucket.in_place = !in_place.empty();
  if (dense && !bucket.in_place) buffers_.fill(b);  // staged gradients into the storage first
  switch (plan_.buckets[b].reduction) {
    case Reduction::kAllReduce:
      if (bucket.in_place) {
        bucket.work = pg_->allreduce_avg_coalesced_async(in_place);
        // On the device the future is not read (see watch_completion): not asked for either.
        watch_completion(
            b, on_device_ ? c10::intrusive_ptr<c10::ivalue::Future>() : bucket.work->getFuture());
      } else if (plan_.buckets[b].sparse) {
        // Sparse gradients travel as (indices, values); Gloo's sparse all-reduce returns a new
        // tensor.
        bucket.sparse = bucket.sparse.div(divisor);
        bucket.work = pg_->allreduce_sum_async(bucket.sparse);
        watch_completion(b, bucket.work->getFuture());
      } else if (hook_) {
        hooks::GradBucket gb = grad_bucket(b);
        bucket.future = hook_->run(gb);
        TORCH_CHECK(bucket.future, "ddp: comm hook '", hook_->name(), "' returned no future");
        watch_completion(b, bucket.future);
      } else if (divisor == pg_->world_size()) {
        // NCCL averages inside the reduction; elsewhere this divides first (the sum of averages
        // stays in range for low-precision dtypes).
        at::Tensor storage = buffers_.storage(b);
        bucket.work = pg_->allreduce_avg_async(storage);
        watch_completion(b, bucket.work->getFuture());
      } else {
        at::Tensor storage = buffers_.storage(b);
        storage.div_(divisor);  // join: only the ranks still training count
        bucket.work = pg_->allreduce_sum_async(storage);
        watch_completion(b, bucket.work->getFuture());
      }
      break;
    case Reduction::kReduceScatter: {
      if (hook_) {
        hooks::GradBucket gb = grad_bucket(b);
        bucket.future = hook_->run(gb);
        TORCH_CHECK(bucket.future, "ddp: comm hook '", hook_->name(), "' returned no future");
        watch_completion(b, bucket.future);
        break;
      }
      // The storage is the unit's transient reduce input (gradients/unit_buckets.hpp): reduced in
      // place, without a full-size copy where the backend emulates the collective.
      at::Tensor storage = buffers_.storage(b);
      if (divisor == pg_->world_size()) {
        bucket.scatter =
            pg_->reduce_scatter_async(storage, comm::ReduceOp::kAvg, /*reuse_input=*/true);
      } else {
        storage.div_(divisor);
        bucket.scatter =
            pg_->reduce_scatter_async(storage, comm::ReduceOp::kSum, /*reuse_input=*/true);
      }
      watch_completion(b, bucket.scatter.work()->getFuture());
      break;
    }
  }
  in_flight_.push_back(b);
}

void BucketRuntime::watch_completion(size_t b,
                                     const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  auto done = std::make_shared<std::atomic<int64_t>>(-1);
  buckets_[b].comm_done_ns = done;
  // A CUDA future completes when its work is enqueued, not when the device ran it: a host
  // timestamp from its callback would be the launch time again. Left unknown (-1) on the GPU.
  if (on_device_) return;
  future->addCallback([done](c10::ivalue::Future&) { done->store(obs::steady_ns()); });
}

bool BucketRuntime::next_completed() const {
  if (in_flight_.empty()) return false;
  const BucketState& bucket = buckets_[in_flight_.front()];
  // Work::isCompleted on NCCL polls the collective's end event.
  if (bucket.future) return !on_device_ && bucket.future->completed();
  if (bucket.scatter.work()) return bucket.scatter.work()->isCompleted();
  return bucket.work && bucket.work->isCompleted();
}

BucketRuntime::Finished BucketRuntime::finish_next() {
  TORCH_CHECK(!in_flight_.empty(), "ddp: finish_next with no bucket in flight");
  const size_t b = in_flight_.front();
  in_flight_.pop_front();
  BucketState& bucket = buckets_[b];
  Finished out;
  out.bucket = b;
  if (bucket.future) {
    auto future = std::move(bucket.future);
    bucket.future.reset();
    wait_future(future, pg_->timeout(), what(b), pg_.get());
    const at::Tensor result = future_tensor(future);
    const at::Tensor& data = buffers_.data(b);
    if (plan_.buckets[b].reduction == Reduction::kReduceScatter) {
      const int64_t shard = data.numel() / pg_->world_size();
      TORCH_CHECK(result.numel() == shard, "ddp: comm hook '", hook_->name(), "' returned ",
                  result.numel(), " elements for reduce-scattered bucket ", b,
                  "; this rank's shard has ", shard);
      out.shard = result;
      bucket.sparse.reset();
      if (bucket.comm_done_ns) out.comm_done_ns = bucket.comm_done_ns->load();
      return out;
    }
    TORCH_CHECK(result.numel() == data.numel(), "ddp: comm hook '", hook_->name(), "' returned ",
                result.numel(), " elements for bucket ", b, " of ", data.numel());
    if (result.data_ptr() != data.data_ptr()) {
      at::NoGradGuard no_grad;
      at::Tensor target = data;
      target.copy_(result);
    }
  } else if (plan_.buckets[b].reduction == Reduction::kReduceScatter) {
    out.shard = bucket.scatter.wait_on_stream(what(b));
    bucket.scatter = comm::PendingCollective();
  } else {
    auto work = std::move(bucket.work);
    bucket.work.reset();
    pg_->wait_on_stream(work, what(b));
    if (plan_.buckets[b].sparse) out.sparse_result = work->result().at(0);
    out.in_place = bucket.in_place;
  }
  bucket.sparse.reset();
  if (bucket.comm_done_ns) out.comm_done_ns = bucket.comm_done_ns->load();
  return out;
}

void BucketRuntime::reset() {
  in_flight_.clear();
  local_ = false;
  next_launch_ = 0;
  divisor_ = 0;
  for (auto& b : buckets_) {
    b.work.reset();
    b.scatter = comm::PendingCollective();
    b.future.reset();
    b.sparse.reset();
    b.in_place = false;
  }
}

void BucketRuntime::shadow_sync(int64_t iteration) {
  at::NoGradGuard no_grad;
  arm_synchronized(iteration, 0);
  // The same collectives, in the same order, as the bucket launches of a synchronized backward.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    TORCH_CHECK(!plan_.buckets[b].sparse, "ddp: join does not support sparse gradients (bucket ", b,
                ")");
    buffers_.fill(b);  // the storage exists from here on (lazy under in-place reduction)
    at::Tensor storage = buffers_.storage(b);
    storage.zero_();
    launch(b);
    in_flight_.pop_back();
    BucketState& bucket = buckets_[b];
    if (bucket.future) {
      wait_future(bucket.future, pg_->timeout(), "join: shadow " + what(b), pg_.get());
      bucket.future.reset();
    } else if (plan_.buckets[b].reduction == Reduction::kReduceScatter) {
      bucket.scatter.wait("join: shadow " + what(b));
      bucket.scatter = comm::PendingCollective();
    } else {
      pg_->wait(bucket.work, "join: shadow " + what(b));
      bucket.work.reset();
    }
  }
  reset();
}

}  // namespace ddp::gradients
