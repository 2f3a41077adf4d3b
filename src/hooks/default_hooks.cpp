#include "ddp/hooks/default_hooks.hpp"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>

namespace ddp::hooks {

namespace {

// The value of a finished all-reduce future: the first (only) tensor of its output list.
at::Tensor first_tensor(c10::ivalue::Future& done) {
  const c10::IValue& value = done.value();
  if (value.isTensor()) return value.toTensor();
  return value.toTensorVector().at(0);
}

// A reduce-scatter's future: its value is this rank's shard, cast to `dtype` when it differs
// (a compressed wire dtype back to the gradients').
c10::intrusive_ptr<c10::ivalue::Future> shard_future(const comm::PendingCollective& pending,
                                                     at::ScalarType dtype) {
  const at::Tensor shard = pending.result();
  if (!pending.work()) return completed_future(shard.to(dtype));  // nothing to reduce
  return pending.work()->getFuture()->then(
      [shard, dtype](c10::ivalue::Future&) { return c10::IValue(shard.to(dtype)); },
      c10::TensorType::get());
}

class AllreduceHook : public CommHook {
 public:
  explicit AllreduceHook(comm::ProcessGroupPtr pg) : pg_(std::move(pg)) {}
  c10::intrusive_ptr<c10::ivalue::Future> run(GradBucket& bucket) override {
    if (bucket.reduce_scatter) {
      return shard_future(pg_->reduce_scatter_async(bucket.buffer, comm::ReduceOp::kAvg),
                          bucket.buffer.scalar_type());
    }
    auto work = pg_->allreduce_avg_async(bucket.buffer);
    return work->getFuture()->then(
        [](c10::ivalue::Future& done) { return c10::IValue(first_tensor(done)); },
        c10::TensorType::get());
  }
  std::string name() const override { return "allreduce"; }

 private:
  comm::ProcessGroupPtr pg_;
};

class NoopHook : public CommHook {
 public:
  c10::intrusive_ptr<c10::ivalue::Future> run(GradBucket& bucket) override {
    if (bucket.reduce_scatter) {
      return completed_future(bucket.buffer.view({bucket.world, -1})[bucket.rank]);
    }
    return completed_future(bucket.buffer);
  }
  std::string name() const override { return "noop"; }
};

class CompressHook : public CommHook {
 public:
  CompressHook(comm::ProcessGroupPtr pg, at::ScalarType wire, std::string name)
      : pg_(std::move(pg)), wire_(wire), name_(std::move(name)) {}
  c10::intrusive_ptr<c10::ivalue::Future> run(GradBucket& bucket) override {
    if (bucket.reduce_scatter) return run_reduce_scatter(bucket);
    c10::intrusive_ptr<c10d::Work> work;
    if (pg_->reduces_avg()) {
      // NCCL: one cast into a wire buffer kept per bucket (no allocation per step), and the
      // average inside the reduction (each input pre-multiplied by 1/world size, so in range).
      at::Tensor& wire = wire_buffer(bucket);
      wire.copy_(bucket.buffer);
      work = pg_->allreduce_avg_async(wire);
    } else {
      // Divide before the cast: the average of fp16 values is in range wherever the values are,
      // their sum over many ranks may not be.
      at::Tensor compressed = bucket.buffer.div(pg_->world_size()).to(wire_);
      if (!pg_->can_sum(wire_)) {
        // Gloo has no bf16 sum: the values are rounded to the wire dtype and summed in fp32.
        // Same rounding of each rank's contribution, no byte savings; NCCL sums bf16 natively.
        compressed = compressed.to(at::kFloat);
      }
      work = pg_->allreduce_sum_async(compressed);
    }
    at::Tensor buffer = bucket.buffer;
    return work->getFuture()->then(
        [buffer](c10::ivalue::Future& done) {
          buffer.copy_(first_tensor(done));  // casts back to the gradients' dtype
          return c10::IValue(buffer);
        },
        c10::TensorType::get());
  }
  std::string name() const override { return name_; }

 private:
  // FULLY_SHARD: the unit's reduce input is made per step (its buffer lives only until its
  // reduction ends), so the wire copy is too; half the bytes on the wire either way.
  c10::intrusive_ptr<c10::ivalue::Future> run_reduce_scatter(GradBucket& bucket) {
    if (pg_->reduces_avg()) {
      return shard_future(pg_->reduce_scatter_async(bucket.buffer.to(wire_), comm::ReduceOp::kAvg),
                          bucket.buffer.scalar_type());
    }
    at::Tensor compressed = bucket.buffer.div(pg_->world_size()).to(wire_);
    if (!pg_->can_sum(wire_)) compressed = compressed.to(at::kFloat);  // as the all-reduce path
    return shard_future(pg_->reduce_scatter_async(compressed, comm::ReduceOp::kSum),
                        bucket.buffer.scalar_type());
  }

  at::Tensor& wire_buffer(const GradBucket& bucket) {
    if (wire_buffers_.size() <= bucket.index) wire_buffers_.resize(bucket.index + 1);
    at::Tensor& wire = wire_buffers_[bucket.index];
    // Remade only when the plan changed (rebuild after iteration 1 or graph planning).
    if (!wire.defined() || wire.numel() != bucket.buffer.numel() ||
        wire.device() != bucket.buffer.device()) {
      wire = at::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(wire_));
    }
    return wire;
  }

  comm::ProcessGroupPtr pg_;
  at::ScalarType wire_;
  std::string name_;
  // Per bucket index: the compressed copy the all-reduce runs on. A bucket's buffer is reused only
  // after its previous reduction was consumed (finish() of the previous iteration), so one each
  // suffices.
  std::vector<at::Tensor> wire_buffers_;
};

}  // namespace

CommHookPtr allreduce_hook(comm::ProcessGroupPtr pg) {
  return std::make_shared<AllreduceHook>(std::move(pg));
}

CommHookPtr fp16_compress_hook(comm::ProcessGroupPtr pg) {
  return std::make_shared<CompressHook>(std::move(pg), at::kHalf, "fp16_compress");
}

CommHookPtr bf16_compress_hook(comm::ProcessGroupPtr pg) {
  return std::make_shared<CompressHook>(std::move(pg), at::kBFloat16, "bf16_compress");
}

CommHookPtr noop_hook() { return std::make_shared<NoopHook>(); }

}  // namespace ddp::hooks
