// ProcessGroup::reduce_scatter_async and all_gather_async: native where the backend has flat
// collectives, emulated on Gloo; padding for uneven splits. Costs: [Note: flat collectives].

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/process_group.hpp"

#include "ddp/comm/flat_shards.hpp"
#include "ddp/comm/made_backend.hpp"
#include "ddp/comm/recorder/collective_progress.hpp"
#include "ddp/comm/recorder/collective_watchdog.hpp"

namespace ddp::comm {

namespace {

// `t` as one flat contiguous tensor over its storage: a view when it already is contiguous.
at::Tensor flat_contiguous(const at::Tensor& t) { return t.contiguous().view({-1}); }

// `flat` zero-padded to `length` elements (a copy), or `flat` itself when it already has them.
at::Tensor padded_to(const at::Tensor& flat, int64_t length) {
  if (flat.numel() == length) return flat;
  at::Tensor padded = at::zeros({length}, flat.options());
  padded.narrow(0, 0, flat.numel()).copy_(flat);
  return padded;
}

}  // namespace

at::Tensor PendingCollective::finish_after_wait() {
  if (finish_) {
    finish_();
    finish_ = nullptr;
  }
  work_.reset();
  return result_;
}

at::Tensor PendingCollective::wait(const std::string& what) {
  if (work_) group_->wait(work_, what);
  return finish_after_wait();
}

at::Tensor PendingCollective::wait_on_stream(const std::string& what) {
  if (work_) group_->wait_on_stream(work_, what);
  return finish_after_wait();
}

PendingCollective ProcessGroup::pending(c10::intrusive_ptr<c10d::Work> work, at::Tensor result,
                                        std::function<void()> finish) const {
  PendingCollective p;
  p.group_ = this;
  p.work_ = std::move(work);
  p.result_ = std::move(result);
  p.finish_ = std::move(finish);
  return p;
}

PendingCollective ProcessGroup::reduce_scatter_async(const at::Tensor& input, ReduceOp op,
                                                     bool reuse_input) {
  TORCH_CHECK(input.defined(), "ddp: reduce_scatter needs a defined input tensor");
  TORCH_CHECK(op == ReduceOp::kSum || at::isFloatingType(input.scalar_type()),
              "ddp: reduce_scatter average needs a floating-point tensor, got ",
              input.scalar_type(), " (use ReduceOp::kSum and divide yourself)");
  const FlatShards layout{input.numel(), world_size()};
  const int64_t offset = layout.offset(rank());
  const int64_t length = layout.length(rank());
  const char* kind = op == ReduceOp::kSum ? "reduce-scatter (sum)" : "reduce-scatter (average)";
  // Nothing to reduce: every rank passes the same numel, so every rank skips the collective and
  // the sequence numbers still match.
  if (layout.numel == 0) return pending({}, at::empty({0}, input.options()));
  const at::Tensor flat = flat_contiguous(input);

  if (traits_.flat_collectives) {
    // Even split: straight from the caller's tensor into a chunk-sized output, no copy.
    at::Tensor in = padded_to(flat, layout.padded_numel());
    at::Tensor out = at::empty({layout.chunk()}, flat.options());
    c10d::ReduceScatterOptions opts;
    // At one rank the average is the sum (allreduce_avg_async says why that is cheaper).
    const bool sum = op == ReduceOp::kSum || world_size() == 1;
    opts.reduceOp = sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::AVG;
    opts.timeout = timeout_;
    auto work = issue({kind, layout.numel, input.scalar_type()},
                      [&] { return made_->backend->_reduce_scatter_base(out, in, opts); });
    return pending(std::move(work), out.narrow(0, 0, length));
  }
  // Emulation: all-reduce a full-size temporary (the input is the caller's and stays intact) or,
  // with reuse_input and a flat input, the input itself; keep this rank's slice of it, a view. The
  // average divides first, as allreduce_avg_async.
  at::Tensor temp;
  if (reuse_input && input.is_contiguous()) {  // then flat is a view of the input
    temp = op == ReduceOp::kAvg ? flat.div_(world_size()) : flat;
  } else {
    temp = op == ReduceOp::kAvg ? flat.div(world_size()) : flat.clone();
  }
  std::vector<at::Tensor> tensors{temp};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  auto work = issue({kind, layout.numel, input.scalar_type()},
                    [&] { return made_->backend->allreduce(tensors, opts); });
  return pending(std::move(work), temp.narrow(0, offset, length));
}

PendingCollective ProcessGroup::all_gather_async(const at::Tensor& shard, at::Tensor output) {
  TORCH_CHECK(shard.defined() && output.defined(),
              "ddp: all_gather needs a defined shard and output");
  TORCH_CHECK(shard.scalar_type() == output.scalar_type() && shard.device() == output.device(),
              "ddp: all_gather: the shard (", shard.scalar_type(), " on ", shard.device(),
              ") and the output (", output.scalar_type(), " on ", output.device(),
              ") must have the same dtype and device");
  const FlatShards layout{output.numel(), world_size()};
  TORCH_CHECK(shard.numel() == layout.length(rank()), "ddp: all_gather on rank ", rank(), " of ",
              world_size(), ": the shard has ", shard.numel(), " elements, but rank ", rank(),
              "'s shard of ", layout.numel, " elements has ", layout.length(rank()),
              " (even split rule: chunk = ceil(", layout.numel, " / ", world_size(),
              ") = ", layout.chunk(), ", the last shards shorter or empty)");
  if (layout.numel == 0) return pending({}, output);  // every rank skips it, as reduce_scatter
  // Straight into the caller's output when the split is even and the output is one flat block;
  // otherwise into a padded buffer copied out after the wait.
  const bool direct = layout.even() && output.is_contiguous();
  at::Tensor gathered =
      direct ? output.view({-1}) : at::empty({layout.padded_numel()}, output.options());
  at::Tensor in = padded_to(flat_contiguous(shard), layout.chunk());
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  if (!traits_.flat_collectives) {
    // Gloo has no flat all-gather, and its list all-gather gathers into a flat tensor of its own
    // that its worker thread drops only some time after the wait returned: one output more alive
    // at moments nobody controls (a sharded unit, measured in tests/shard/backward_memory_test).
    // An all-reduce (sum) of `gathered` with only this rank's slice non-zero gathers in place,
    // exactly (x + 0 = x; a -0.0 arrives as +0.0), for twice an all-gather's bytes on the wire.
    // (Tried back on 2026-11-27: 20-30% faster CPU steps, but the memory test's bound failed under
    // load; docs/benchmarks.md, "what 8bdd6c9 costs".)
    gathered.zero_();
    gathered.narrow(0, rank() * layout.chunk(), layout.chunk()).copy_(in);
  }
  auto work = issue({"all-gather (flat)", layout.numel, output.scalar_type()}, [&] {
    if (traits_.flat_collectives) return made_->backend->_allgather_base(gathered, in, opts);
    std::vector<at::Tensor> tensors{gathered};
    c10d::AllreduceOptions sum;
    sum.reduceOp = c10d::ReduceOp::SUM;
    sum.timeout = timeout_;
    return made_->backend->allreduce(tensors, sum);
  });
  std::function<void()> finish;
  if (!direct) {
    finish = [gathered, output, numel = layout.numel]() mutable {
      output.copy_(gathered.narrow(0, 0, numel).view(output.sizes()));
    };
  }
  return pending(std::move(work), output, std::move(finish));
}

PendingCollective ProcessGroup::all_gather_async(const at::Tensor& shard, int64_t numel) {
  TORCH_CHECK(numel >= 0, "ddp: all_gather needs numel >= 0, got ", numel);
  return all_gather_async(shard, at::empty({numel}, shard.options()));
}

at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& input, ReduceOp op,
                                        const std::string& what) {
  return reduce_scatter_async(input, op).wait(what);
}

at::Tensor ProcessGroup::all_gather(const at::Tensor& shard, int64_t numel,
                                    const std::string& what) {
  return all_gather_async(shard, numel).wait(what);
}

}  // namespace ddp::comm
